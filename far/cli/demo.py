"""`far demo`: the whole FAR story on the embedded MiniLM and CoLA, in a few minutes.

Prime (ordinary fine-tuning while a Primer watches the FFNs) -> select learners -> split every FFN
-> check outputs are unchanged -> train only the learners -> evaluate -> save the learners-only
file -> restore a plain model and save it. Each step prints what it did.

    far demo --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from transformers import DataCollatorWithPadding

import far
from far.cli.common import add_data_arguments
from far.tasks.evaluators import GlueEvaluator
from far.tasks.glue import GLUE_TASKS, load_glue, tokenize_glue
from far.tasks.models import DEFAULT_MODEL, load_model_and_tokenizer
from far.tasks.settings import first


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a few-minute tour: prime, reconfigure, train, evaluate, save, restore",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"(default: {DEFAULT_MODEL})")
    parser.add_argument("--retention", type=float, default=0.4, help="(default: 0.4)")
    parser.add_argument("--max-train-samples", type=int, default=None, help="CoLA training sentences (default: all)")
    parser.add_argument("--epochs", type=float, default=1.0, help="(default: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/demo", help="(default: runs/demo)")
    add_data_arguments(parser)
    parser.set_defaults(func=run, max_eval_samples=None)


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    task = GLUE_TASKS["cola"]
    out = Path(args.output_dir)
    splits = load_glue(task.name, args.data_dir)  # a clear error, before anything else, if there is no data
    model, tokenizer = load_model_and_tokenizer(args.model, task.kind, task.num_labels, seed=args.seed)
    train = tokenize_glue(first(splits["train"], args.max_train_samples), tokenizer, task, 64)
    dev = tokenize_glue(first(splits["validation"], args.max_eval_samples), tokenizer, task, 64)
    collate = DataCollatorWithPadding(tokenizer)
    evaluate = GlueEvaluator(task, dev, collate)
    print(
        f"model {args.model}: {far.summary(model, verbose=False).total_parameters:,} parameters, "
        f"{len(far.find_ffns(model))} FFNs; CoLA: {len(train)} training / {len(dev)} dev sentences"
    )

    _step(f"far.finetune: prime 10% of the steps, keep {args.retention:.0%} of FFN nodes, train the learners")
    result = far.finetune(
        model, train, retention=args.retention, epochs=args.epochs, lr=5e-5, batch_size=32, warmup=0.06,
        collate_fn=collate, eval_fn=evaluate, seed=args.seed, output_dir=out, progress=True,
    )  # fmt: skip
    far.summary(model)
    print(f"dev Matthews correlation: {result.metrics['matthews_correlation']:.4f}")
    print(
        f"time: priming {result.priming_seconds:.1f} s + training {result.training_seconds:.1f} s "
        f"(+ eval {result.eval_seconds:.1f} s); peak RSS {result.peak_rss_bytes / 2**20:,.0f} MiB"
    )

    _step("parity: the split model and its merged copy give the same logits")
    batch = collate([dev[i] for i in range(min(16, len(dev)))])
    batch.pop("labels", None)
    merged = far.restore(copy.deepcopy(model)).eval()
    with torch.no_grad():
        difference = (model.eval()(**batch).logits - merged(**batch).logits).abs().max().item()
    print(f"max |logit difference| = {difference:.2e} (fp32 summation order only)")

    _step("save: the learners-only file (what a user's adaptation weighs), then a plain merged model")
    started = time.perf_counter()
    learners_file = far.save_learners(model, out / "learners.safetensors")
    far.restore(model).save_pretrained(out / "merged")
    tokenizer.save_pretrained(out / "merged")
    merged_bytes = sum(f.stat().st_size for f in (out / "merged").glob("*.safetensors"))
    print(
        f"{learners_file}: {learners_file.stat().st_size / 2**20:.1f} MiB; {out / 'merged'}: "
        f"{merged_bytes / 2**20:.1f} MiB of weights, loads with AutoModelForSequenceClassification "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0
