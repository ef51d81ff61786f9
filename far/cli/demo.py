"""`far demo`: FAR against full fine-tuning on the embedded MiniLM and SST-2, in a few minutes.

Fine-tune the same model on the same sentences with the same hyper-parameters twice: full
fine-tuning, and FAR (prime 10% of the steps, keep 20% of the FFN nodes as learners, embeddings
frozen). Print both dev accuracies beside the majority-class baseline, the trainable parameters,
their step times measured side by side, the parity check (split vs merged logits), and the size of
FAR's learners-only file beside the merged model's.

    far demo --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from transformers import DataCollatorWithPadding

import far
from far.cli.common import add_data_arguments
from far.data.glue import GLUE_TASKS, load_glue, tokenize_glue
from far.data.locate import locate_data_dir
from far.evaluation.evaluators import GlueEvaluator
from far.models import DEFAULT_MODEL, load_model_and_tokenizer
from far.recipes.compare import majority_baseline, paired_step_times
from far.recipes.predict import Predictor, model_card
from far.recipes.settings import first

TASK = GLUE_TASKS["sst2"]
MAX_LENGTH = 64  # SST-2's sentences: 99.8% of the dev set fits


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a few-minute tour: FAR vs full fine-tuning on SST-2, parity, learners file, predictions",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"(default: {DEFAULT_MODEL})")
    parser.add_argument("--retention", type=float, default=0.2, help="FAR's share of learner nodes (default: 0.2)")
    parser.add_argument(
        "--train-embeddings", action="store_true", help="let FAR train the embeddings too (a far larger learners file)"
    )
    parser.add_argument(
        "--max-train-samples", type=int, default=2000, help="SST-2 training sentences (default: the first 2000)"
    )
    parser.add_argument("--epochs", type=float, default=1.0, help="(default: 1)")
    parser.add_argument("--lr", type=float, default=1e-4, help="(default: 1e-4)")
    parser.add_argument("--timing-rounds", type=int, default=10, help="side-by-side step-time rounds (default: 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/demo", help="(default: runs/demo)")
    add_data_arguments(parser)
    parser.set_defaults(func=run, max_eval_samples=None)


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out = Path(args.output_dir)
    far_config = far.FARConfig(args.retention, seed=args.seed, freeze_embeddings=not args.train_embeddings)
    root = locate_data_dir(args.data_dir, needs=f"glue/{TASK.folder}/train.tsv and dev.tsv")
    splits = load_glue(TASK.name, root)  # a clear error, before anything else, if there is no data
    model, tokenizer = load_model_and_tokenizer(
        args.model, TASK.kind, TASK.num_labels, label_names=TASK.label_names, finetuning_task=TASK.name, seed=args.seed
    )
    full_model = copy.deepcopy(model)  # the same pretrained weights and the same new head
    train = tokenize_glue(first(splits["train"], args.max_train_samples), tokenizer, TASK, MAX_LENGTH)
    dev = tokenize_glue(first(splits["validation"], args.max_eval_samples), tokenizer, TASK, MAX_LENGTH)
    collate = DataCollatorWithPadding(tokenizer)
    evaluate = GlueEvaluator(TASK, dev, collate)
    majority, baseline = majority_baseline(dev["labels"], evaluate.metric)
    print(
        f"model {args.model}: {far.summary(model, verbose=False).total_parameters:,} parameters, "
        f"{len(far.find_ffns(model))} FFNs; SST-2: {len(train):,} training / {len(dev):,} dev sentences"
    )
    print(f"majority-class baseline (always {TASK.label_names[majority]!r}): dev accuracy {baseline['accuracy']:.4f}")
    hyper = dict(epochs=args.epochs, lr=args.lr, batch_size=32, warmup=0.06, collate_fn=collate, eval_fn=evaluate)
    shown = f"{args.epochs:g} epoch(s), lr {args.lr:g}, batch 32, seed {args.seed}"

    _step(f"full fine-tuning: every weight trains ({shown})")
    full = far.finetune(full_model, train, None, seed=args.seed, progress=True, **hyper)
    print(f"dev accuracy {full.metrics['accuracy']:.4f}; training {full.priming_seconds + full.training_seconds:.0f} s")

    embeddings = "frozen" if far_config.freeze_embeddings else "trained"
    _step(f"FAR: prime 10% of the steps, keep {args.retention:.0%} of FFN nodes, embeddings {embeddings} ({shown})")
    result = far.finetune(model, train, far_config, seed=args.seed, output_dir=out / "far", progress=True, **hyper)
    print(
        f"dev accuracy {result.metrics['accuracy']:.4f}; training "
        f"{result.priming_seconds + result.training_seconds:.0f} s (priming included)"
    )
    far.summary(model)

    _step(f"step time, side by side: one training step of each model per round, {args.timing_rounds} rounds")
    batch = collate([train[i] for i in range(min(32, len(train)))])
    times = paired_step_times({"full": full_model, "far": model}, batch, rounds=args.timing_rounds, lr=args.lr)
    ratios = sorted(f / g for f, g in zip(times["far"], times["full"], strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3  # one round: no spread
    print(
        f"median step: full {statistics.median(times['full']) * 1e3:.0f} ms, FAR "
        f"{statistics.median(times['far']) * 1e3:.0f} ms; FAR / full per round: median "
        f"{statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f})"
    )

    _step("parity: the split model and its merged copy give the same logits")
    probe = collate([dev[i] for i in range(min(16, len(dev)))])
    probe.pop("labels", None)
    merged = far.restore(copy.deepcopy(model)).eval()
    with torch.no_grad():
        difference = (model.eval()(**probe).logits - merged(**probe).logits).abs().max().item()
    print(f"max |logit difference| = {difference:.2e} (fp32 summation order only)")

    _step("save: FAR's learners-only file (one user's adaptation), then the merged model")
    learners_file = far.save_learners(model, out / "learners.safetensors")
    merged.save_pretrained(out / "merged")
    tokenizer.save_pretrained(out / "merged")
    learners_bytes = learners_file.stat().st_size
    merged_bytes = sum(f.stat().st_size for f in (out / "merged").glob("*.safetensors"))
    print(
        f"{learners_file}: {_mib(learners_bytes)}, {learners_bytes / merged_bytes:.0%} of the merged model "
        f"({out / 'merged'}: {_mib(merged_bytes)}, loads with AutoModelForSequenceClassification)"
    )

    _step(f"predict with the merged model (far predict --model {out / 'merged'})")
    predictor = Predictor(merged, tokenizer, model_card(out / "merged"))
    for row in predictor(["A gorgeous, funny and moving film.", "A tedious mess that goes nowhere."]):
        print(f"{row['label']:>8} {row['score']:.3f}  {row['sentence']}")

    _step("one base model, many users: the learners file on a freshly loaded stock model")
    stock, _ = load_model_and_tokenizer(
        args.model, TASK.kind, TASK.num_labels, label_names=TASK.label_names, finetuning_task=TASK.name, seed=args.seed
    )
    far.load_learners(stock, learners_file)  # priming's changes to frozen weights were undone: it fits the stock model
    with torch.no_grad():
        same = torch.equal(stock.eval()(**probe).logits, model(**probe).logits)
    print(
        f"stock {args.model} + {learners_file.name} gives the trained model's logits "
        f"{'bit for bit' if same else 'NOT bit for bit'} (far predict --model {args.model} --learners {learners_file})"
    )
    if not same:
        raise RuntimeError("the learners file did not reproduce the trained model on the stock base")

    full_params = far.summary(full_model, verbose=False).trainable_parameters
    far_params = far.summary(model, verbose=False).trainable_parameters
    _step(f"summary: SST-2 dev accuracy, {len(train):,} training sentences, {shown}")
    print(f"{'':<34}{'dev accuracy':>13}{'trainable params':>18}{'step / full':>13}")
    print(f"{'majority class':<34}{baseline['accuracy']:>13.4f}")
    print(f"{'full fine-tuning':<34}{full.metrics['accuracy']:>13.4f}{full_params:>18,}{1:>13.3f}")
    print(
        f"{f'FAR r={args.retention:g}, embeddings {embeddings}':<34}{result.metrics['accuracy']:>13.4f}"
        f"{far_params:>18,}{statistics.median(ratios):>13.3f}"
    )
    print(
        f"learners file {_mib(learners_bytes)} = {learners_bytes / merged_bytes:.0%} of the merged model's "
        f"{_mib(merged_bytes)}; parity {difference:.1e}; demo wall time {time.perf_counter() - started:.0f} s"
    )
    return 0
