"""`far demo`: FAR's default, its automatic configuration, against full fine-tuning and a frozen bottom, on SST-2.

Fine-tune the same model on the same sentences with the same hyper-parameters and seed three times:
full fine-tuning; FAR's default, as it configures itself (what `far glue --method far` runs; prime
10% of the steps, keep as learners the nodes that hold half of each FFN's priming change, embeddings
frozen, the bottom layers frozen at the depth priming chooses and their output kept per example);
and the practitioner's baseline, the bottom 3 layers frozen and kept, every weight above them
training. Print each arm's dev accuracy, the process CPU seconds of its whole `far.finetune` call
and its ratio to full's, its trainable parameters and the file it ships; then FAR's parity check
(split vs merged logits), learners file, predictions, and the learners file on a stock model.

    far demo --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DataCollatorWithPadding

import far
from far.cli.arguments import add_data_arguments, retention_or_auto
from far.cli.common import UsageError
from far.config import AUTO
from far.data.glue import GLUE_TASKS, load_glue, tokenize_glue
from far.data.locate import locate_data_dir
from far.evaluation.evaluators import GlueEvaluator
from far.models import DEFAULT_MODEL, load_model_and_tokenizer
from far.recipes.compare import cpu_timed, majority_baseline, paired_step_times, save_trained_tensors
from far.recipes.configuration import Configuration
from far.recipes.outputs import IDENTITY_KEYS, claim_output_dir, describe, existing_run
from far.recipes.predict import Predictor, model_card
from far.recipes.settings import first
from far.storage import lock
from far.storage.atomic import write_json

TASK = GLUE_TASKS["sst2"]
MAX_LENGTH = 64  # SST-2's sentences: 99.8% of the dev set fits
BASELINE_DEPTH = 3  # the plain baseline docs/results.md measured ("full, bottom 3 frozen, kept")
# What the demo writes into its folder besides a run's files (far.recipes.outputs.RUN_OUTPUTS): --overwrite removes
# these too, and nothing else a folder given by hand may hold.
DEMO_FOLDERS = ("far", "merged", f"bottom{BASELINE_DEPTH}")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a few-minute tour: full fine-tuning, FAR's automatic configuration and a frozen bottom on SST-2",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"(default: {DEFAULT_MODEL})")
    parser.add_argument(
        "--retention",
        type=retention_or_auto,
        default=AUTO,
        help="FAR's share of learner nodes, or auto: each FFN's from priming (default: auto)",
    )
    parser.add_argument(
        "--train-embeddings", action="store_true", help="let FAR train the embeddings too (a far larger learners file)"
    )
    parser.add_argument(
        "--max-train-samples", type=int, default=2000, help="SST-2 training sentences (default: the first 2000)"
    )
    parser.add_argument("--epochs", type=float, default=1.0, help="(default: 1)")
    parser.add_argument("--lr", type=float, default=1e-4, help="(default: 1e-4)")
    parser.add_argument(
        "--timing-rounds",
        type=int,
        default=0,
        help="also time this many training steps of the three arms side by side (default: 0, off: the whole-arm "
        "CPU time is what a user waits for)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--group-by-length",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batch sentences of similar lengths together, in every arm (default: on; SST-2's random batches of "
        "32 pad to 3x their tokens)",
    )
    parser.add_argument("--output-dir", default="runs/demo", help="(default: runs/demo)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the demo (or run) that --output-dir holds (its files only); without it, a folder that holds "
        "one is refused before anything loads",
    )
    add_data_arguments(parser)
    parser.set_defaults(func=run, max_eval_samples=None)


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Arm:
    """One trained configuration: what it scored, what it cost, what it ships."""

    label: str
    accuracy: float
    cpu_seconds: float  # the whole far.finetune call: priming, training and the final evaluation
    trainable_parameters: int
    shipped: Path


def claim_demo_dir(out: Path, model: str, overwrite: bool) -> None:
    """Make `out` the demo's, as every training command claims its folder (`far.recipes.outputs`): a folder that
    holds a demo or a run is refused (UsageError) unless `overwrite`, which removes that run's files first."""
    lock.hold(out)  # another process's run into this folder is refused before anything here changes
    held = existing_run(out)
    if held is not None and not overwrite:
        what = describe(held) if any(key in held for key in IDENTITY_KEYS) else "made by an earlier far"
        raise UsageError(
            f"{out} already holds a run ({what}); nothing was changed. Choose another --output-dir, or add "
            "--overwrite to replace it"
        )
    if held is not None:
        for name in DEMO_FOLDERS:
            if (out / name).is_dir() and not (out / name).is_symlink():
                shutil.rmtree(out / name)
    identity = {"task": TASK.name, "model": model, "method": "demo", "optimizer": "adamw"}
    claim_output_dir(out, identity, resume=False, overwrite=True)


@dataclass
class Setup:
    """What every arm shares: the data, the hyper-parameters and the untouched model each arm starts from."""

    args: argparse.Namespace
    out: Path
    model: torch.nn.Module
    tokenizer: object
    train: object
    dev: object
    collate: DataCollatorWithPadding
    hyper: dict
    shown: str  # the hyper-parameters as the headings print them
    baseline: float  # the majority class's dev accuracy

    @property
    def default(self) -> bool:
        """FAR's default (`far glue --method far`, far.finetune(config="auto")), not a retention or embeddings asked
        for."""
        return self.args.retention == AUTO and not self.args.train_embeddings


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    setup = _prepare(args)
    full_model, bottom_model = copy.deepcopy(setup.model), copy.deepcopy(setup.model)
    print("time: process CPU seconds of each arm's whole far.finetune call (priming and the final evaluation included)")
    full = _arm(setup, "full fine-tuning: every weight trains", full_model)
    far_run, share, depth = _train_far(setup)
    bottom = _arm(
        setup,
        f"frozen bottom: embeddings and layers 0-{BASELINE_DEPTH - 1} frozen and kept, every weight above trains",
        bottom_model,
        freeze_layers=BASELINE_DEPTH,
        cache_frozen=True,
    )
    bottom_file = save_trained_tensors(bottom_model, setup.out / f"bottom{BASELINE_DEPTH}" / "trained.safetensors")
    if args.timing_rounds > 0:
        _time_steps(setup, {"full": full_model, "far": setup.model, "bottom": bottom_model})
    difference, learners_file, merged_bytes = _check_and_ship(setup)
    far_label = f"FAR {'auto' if args.retention == AUTO else f'r={args.retention:g}'}: {share:.0%} nodes, depth {depth}"
    arms = [
        Arm(label, result.metrics["accuracy"], seconds, result.trainable_parameters, shipped)
        for label, (result, seconds), shipped in (
            ("full fine-tuning", full, setup.out / "merged"),
            (far_label, far_run, learners_file),
            (f"bottom {BASELINE_DEPTH} frozen, kept", bottom, bottom_file),
        )
    ]
    sizes = {arm.label: merged_bytes if arm.shipped.is_dir() else arm.shipped.stat().st_size for arm in arms}
    _summarize(setup, arms, sizes, bottom_file, difference, time.perf_counter() - started)
    _write_metrics(setup, arms, sizes, depth)
    return 0


def _prepare(args: argparse.Namespace) -> Setup:
    """The data first, then the folder, before the model loads: a clear error before anything else changes."""
    out = Path(args.output_dir)
    root = locate_data_dir(args.data_dir, needs=f"glue/{TASK.folder}/train.tsv and dev.tsv")
    splits = load_glue(TASK.name, root)
    claim_demo_dir(out, args.model, args.overwrite)
    model, tokenizer = _load(args)
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
    hyper = dict(
        epochs=args.epochs,
        lr=args.lr,
        batch_size=32,
        warmup=0.06,
        collate_fn=collate,
        eval_fn=evaluate,
        seed=args.seed,
        group_by_length=args.group_by_length,
    )
    grouped = ", grouped by length" if args.group_by_length else ""
    shown = f"{args.epochs:g} epoch(s), lr {args.lr:g}, batch 32{grouped}, seed {args.seed}"
    return Setup(args, out, model, tokenizer, train, dev, collate, hyper, shown, baseline["accuracy"])


def _load(args: argparse.Namespace):
    """The pretrained model with its seeded new head: every arm, and the stock base, start from the same weights."""
    return load_model_and_tokenizer(
        args.model, TASK.kind, TASK.num_labels, label_names=TASK.label_names, finetuning_task=TASK.name, seed=args.seed
    )


def _arm(setup: Setup, heading: str, model: torch.nn.Module, config: object = None, **options: object):
    """One arm's whole `far.finetune` call, timed in CPU seconds and reported; returns (result, seconds)."""
    _step(f"{heading} ({setup.shown})")
    result, seconds = cpu_timed(
        lambda: far.finetune(model, setup.train, config, progress=True, **options, **setup.hyper)
    )
    print(
        f"dev accuracy {result.metrics['accuracy']:.4f}; {seconds:.0f} CPU s (wall: priming "
        f"{result.priming_seconds:.0f} s, training {result.training_seconds:.0f} s, evaluation "
        f"{result.eval_seconds:.0f} s)"
    )
    return result, seconds


def _train_far(setup: Setup):
    """FAR's arm, on the setup's own model; returns its (result, CPU seconds), learner share and frozen depth."""
    args = setup.args
    asked = dict(retention=args.retention, seed=args.seed, freeze_embeddings=not args.train_embeddings)
    config = "auto" if setup.default else far.FARConfig.auto(**asked)
    embeddings = "trained" if args.train_embeddings else "frozen"
    keep = "the nodes that hold half of each FFN's change" if args.retention == AUTO else f"{args.retention:.0%}"
    what = "FAR's default, its automatic configuration" if setup.default else "FAR, automatic"
    heading = (
        f"{what}: prime 10% of the steps, keep {keep} as learners, embeddings {embeddings}, "
        "bottom layers frozen at the depth priming chooses and kept"
    )
    ran = _arm(setup, heading, setup.model, config, output_dir=setup.out / "far", cache_frozen=True)
    far.summary(setup.model)
    configured = far.summary(setup.model, verbose=False)
    share = sum(k for k, _ in configured.learners.values()) / sum(n for _, n in configured.learners.values())
    return ran, share, configured.frozen_layers[0]


def _time_steps(setup: Setup, models: dict) -> None:
    rounds = setup.args.timing_rounds
    _step(f"step time, side by side: one training step of each arm per round, {rounds} rounds")
    batch = setup.collate([setup.train[i] for i in range(min(32, len(setup.train)))])
    times = paired_step_times(models, batch, rounds=rounds, lr=setup.args.lr)
    # the kept bottom is not used here: a step runs the whole model, so this is the step without the cache
    print(", ".join(f"{name} {statistics.median(t) * 1e3:.0f} ms" for name, t in times.items()) + " (median)")


def _check_and_ship(setup: Setup) -> tuple[float, Path, int]:
    """Parity of the split and merged models, the files a user keeps, predictions, and the learners file on a stock
    model; returns the largest logit difference, the learners file and the merged model's bytes."""
    model, out, dev = setup.model, setup.out, setup.dev
    _step("parity: the split model and its merged copy give the same logits")
    probe = setup.collate([dev[i] for i in range(min(16, len(dev)))])
    probe.pop("labels", None)
    merged = far.restore(copy.deepcopy(model)).eval()
    with torch.no_grad():
        difference = (model.eval()(**probe).logits - merged(**probe).logits).abs().max().item()
    print(f"max |logit difference| = {difference:.2e} (fp32 summation order only)")

    _step("save: FAR's learners-only file (one user's adaptation), then the merged model")
    learners_file = far.save_learners(model, out / "learners.safetensors")
    merged.save_pretrained(out / "merged")
    setup.tokenizer.save_pretrained(out / "merged")
    learners_bytes = learners_file.stat().st_size
    merged_bytes = sum(f.stat().st_size for f in (out / "merged").glob("*.safetensors"))
    print(
        f"{learners_file}: {_mib(learners_bytes)}, {learners_bytes / merged_bytes:.0%} of the merged model "
        f"({out / 'merged'}: {_mib(merged_bytes)}, loads with AutoModelForSequenceClassification)"
    )

    _step(f"predict with the merged model (far predict --model {out / 'merged'})")
    predictor = Predictor(merged, setup.tokenizer, model_card(out / "merged"))
    for row in predictor(["A gorgeous, funny and moving film.", "A tedious mess that goes nowhere."]):
        print(f"{row['label']:>8} {row['score']:.3f}  {row['sentence']}")

    _step("one base model, many users: the learners file on a freshly loaded stock model")
    stock, _ = _load(setup.args)
    far.load_learners(stock, learners_file)  # priming's changes to frozen weights were undone: it fits the stock model
    with torch.no_grad():
        same = torch.equal(stock.eval()(**probe).logits, model(**probe).logits)
    base = setup.args.model
    print(
        f"stock {base} + {learners_file.name} gives the trained model's logits "
        f"{'bit for bit' if same else 'NOT bit for bit'} (far predict --model {base} --learners {learners_file})"
    )
    if not same:
        raise RuntimeError("the learners file did not reproduce the trained model on the stock base")
    return difference, learners_file, merged_bytes


def _summarize(setup: Setup, arms: list[Arm], sizes: dict, bottom_file: Path, difference: float, wall: float) -> None:
    full_seconds = arms[0].cpu_seconds
    _step(f"summary: SST-2 dev accuracy, {len(setup.train):,} training sentences, {setup.shown}")
    print(f"{'':<34}{'dev accuracy':>13}{'CPU s':>8}{'/ full':>8}{'trainable params':>18}{'ships':>11}")
    print(f"{'majority class':<34}{setup.baseline:>13.4f}")
    for arm in arms:
        print(
            f"{arm.label:<34}{arm.accuracy:>13.4f}{arm.cpu_seconds:>8.0f}{arm.cpu_seconds / full_seconds:>8.2f}"
            f"{arm.trainable_parameters:>18,}{_mib(sizes[arm.label]):>11}"
        )
    print(
        "CPU s: the whole far.finetune call, priming and the final evaluation included; ships: the merged model, "
        f"FAR's learners file, the trained tensors (safetensors, {bottom_file}); parity {difference:.1e}; "
        f"demo wall time {wall:.0f} s"
    )


def _write_metrics(setup: Setup, arms: list[Arm], sizes: dict, depth: int) -> None:
    args = setup.args
    chosen = (
        Configuration("auto", "the default of --method far")
        if setup.default
        else Configuration("custom", "--retention/--train-embeddings given")
    )
    configuration = chosen.record(
        args.retention, frozen_layers=depth, freeze_embeddings=not args.train_embeddings, cache_frozen=True
    )
    write_json(
        setup.out / "metrics.json",
        {
            "task": TASK.name,
            "model": args.model,
            "training_examples": len(setup.train),
            "majority_accuracy": setup.baseline,
            "arms": [
                {"arm": a.label, "accuracy": a.accuracy, "cpu_seconds": a.cpu_seconds, "ships_bytes": sizes[a.label]}
                for a in arms
            ],
            "configuration": configuration,  # FAR's arm
        },
    )
