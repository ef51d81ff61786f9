"""What the `far glue` / `far squad` / `far eval` commands share: arguments, methods, outputs, errors."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import far
from far.atomic import atomic_file
from far.data.locate import DATA_DIR_ENV
from far.models import DEFAULT_MODEL, MODEL_ALIASES

logger = logging.getLogger("far.cli")

# How each --method maps onto far.finetune's arguments.
METHODS: dict[str, dict] = {
    "full": dict(retention=None),
    "far": dict(selection="per_layer"),
    "random": dict(selection="random"),
    "freeze-ffn": dict(retention=None, freeze_ffn=True),
}
OPTIMIZERS = ("adamw", "mezo")
# far.finetune options recorded in metrics.json beside the resolved hyper-parameters.
RECORDED_OPTIONS = (
    "priming",
    "weight_decay",
    "grad_accum",
    "bf16",
    "freeze_embeddings",
    "seed",
    "mezo_eps",
    "mezo_directions",
)
LOG_FILE = "train.log"
METRICS_FILE = "metrics.json"


class UsageError(Exception):
    """A mistake in what the user asked for; `far` prints it as `far <cmd>: error: <message>` and exits 2."""


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"local data root with glue/<Task>/ and squad/ (default: ${DATA_DIR_ENV}; else the hub)",
    )
    parser.add_argument("--max-eval-samples", type=int, default=None, help="evaluate on the first N examples only")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of every training command; hyper-parameters left None take the task's defaults."""
    aliases = ", ".join(MODEL_ALIASES)
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"alias ({aliases}), Hugging Face model folder or hub name (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--method",
        choices=list(METHODS),
        default="far",
        help="full fine-tuning, FAR, random learner selection, or freezing every FFN (default: far)",
    )
    parser.add_argument(
        "--retention", type=float, default=0.4, help="fraction of FFN nodes kept trainable by far/random (default: 0.4)"
    )
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="(default: adamw)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: per task and optimizer)")
    parser.add_argument("--epochs", type=float, default=None, help="training epochs (default: per task)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    parser.add_argument("--batch-size", type=int, default=None, help="training batch size (default: per task)")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="evaluation batch size (default: 64)")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per sequence (default: per task)")
    parser.add_argument("--max-train-samples", type=int, default=None, help="train on the first N examples only")
    parser.add_argument(
        "--priming",
        type=fraction_or_steps,
        default=0.1,
        help="steps that prime FAR's node scores: a fraction of the run (0.1) or a number of steps (50)",
    )
    parser.add_argument(
        "--warmup",
        type=fraction_or_steps,
        default=None,
        help="learning-rate warm-up: a fraction or a number of steps (default: per task)",
    )
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: 0)")
    parser.add_argument("--grad-accum", type=int, default=1, help="batches per optimizer step (default: 1)")
    parser.add_argument("--mezo-eps", type=float, default=1e-3, help="MeZO perturbation size (default: 0.001)")
    parser.add_argument("--mezo-directions", type=int, default=1, help="MeZO random directions per step (default: 1)")
    parser.add_argument("--freeze-embeddings", action="store_true", help="also freeze the embeddings (far/random)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast for training and evaluation")
    parser.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (always at the end)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the new head, data order, dropout, selection and MeZO (default: 0)"
    )
    parser.add_argument(
        "--output-dir", default=None, help="where metrics, predictions and the log go (default: runs/<task>-<method>)"
    )
    parser.add_argument(
        "--model-dir", default=None, help="where the fine-tuned model is saved (default: <output-dir>/model)"
    )
    parser.add_argument("--no-save-model", action="store_true", help="do not save the fine-tuned model")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def describe_defaults(defaults: Mapping[str, Mapping]) -> str:
    """The per-optimizer defaults as help text, e.g. "adamw: lr 5e-05, epochs 3.0, ..."."""
    lines = ["defaults per optimizer (override with the flags):"]
    for optimizer, values in defaults.items():
        shown = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in values.items() if v is not None)
        lines.append(f"  {optimizer}: {shown}")
    return "\n".join(lines)


def resolve_hyperparameters(args: argparse.Namespace, defaults: Mapping[str, Mapping]) -> dict:
    """Fill every hyper-parameter the user left out from `defaults[optimizer]`, and check them all.

    Raises:
        UsageError: a value out of range, named with its flag.
    """
    chosen = {k: getattr(args, k) for k in ("lr", "epochs", "max_steps", "batch_size", "max_length", "warmup")}
    # The run's length comes whole from the user (--epochs and/or --max-steps) or whole from the defaults.
    user_length = args.epochs is not None or args.max_steps is not None
    for key, value in defaults[args.optimizer].items():
        if chosen.get(key) is None and not (user_length and key in ("epochs", "max_steps")):
            chosen[key] = value
    checks = [
        ("--lr", chosen["lr"], chosen["lr"] > 0),
        ("--batch-size", chosen["batch_size"], chosen["batch_size"] >= 1),
        ("--max-length", chosen["max_length"], chosen["max_length"] >= 8),
        ("--epochs", chosen["epochs"], chosen["epochs"] is None or chosen["epochs"] > 0),
        ("--max-steps", chosen["max_steps"], chosen["max_steps"] is None or chosen["max_steps"] >= 1),
        ("--warmup", chosen["warmup"], chosen["warmup"] >= 0 and _fraction_or_steps(chosen["warmup"])),
        ("--retention", args.retention, 0 < args.retention <= 1),
        ("--priming", args.priming, args.priming >= 0 and _fraction_or_steps(args.priming)),
        ("--grad-accum", args.grad_accum, args.grad_accum >= 1),
        ("--eval-batch-size", args.eval_batch_size, args.eval_batch_size >= 1),
        ("--eval-every", args.eval_every, args.eval_every is None or args.eval_every >= 1),
        ("--max-train-samples", args.max_train_samples, args.max_train_samples is None or args.max_train_samples >= 1),
        ("--max-eval-samples", args.max_eval_samples, args.max_eval_samples is None or args.max_eval_samples >= 1),
    ]
    for flag, value, ok in checks:
        if not ok:
            raise UsageError(f"{flag} {value} is out of range; see `far {args.command} --help`")
    if chosen["epochs"] is None and chosen["max_steps"] is None:
        raise UsageError("give --epochs or --max-steps")
    return chosen


def fraction_or_steps(text: str) -> float | int:
    """argparse type: "0.1" is a fraction of the run's steps, "50" a number of steps (as far.finetune takes them)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _fraction_or_steps(value: float | int) -> bool:
    return isinstance(value, int) or value < 1


def finetune_kwargs(args: argparse.Namespace, hparams: Mapping) -> dict:
    """Keyword arguments for `far.finetune` from the method, optimizer and hyper-parameters."""
    method = dict(METHODS[args.method])
    if "retention" not in method:
        method["retention"] = args.retention
    epochs = hparams["epochs"] if hparams["epochs"] is not None else 1.0
    return dict(
        optimizer=args.optimizer,
        priming=args.priming,
        freeze_embeddings=args.freeze_embeddings,
        epochs=epochs,
        max_steps=hparams["max_steps"],
        lr=hparams["lr"],
        batch_size=hparams["batch_size"],
        warmup=hparams["warmup"],
        weight_decay=args.weight_decay,
        grad_accum=args.grad_accum,
        bf16=args.bf16,
        eval_every=args.eval_every,
        seed=args.seed,
        mezo_eps=args.mezo_eps,
        mezo_directions=args.mezo_directions,
        progress=not args.no_progress,
        **method,
    )


def first(dataset, n: int | None):
    """The first `n` rows of a `datasets.Dataset` (all when n is None or larger)."""
    return dataset if n is None or n >= len(dataset) else dataset.select(range(n))


def output_dir(args: argparse.Namespace, name: str) -> Path:
    return Path(args.output_dir) if args.output_dir else Path("runs") / name


@contextmanager
def run_log(directory: Path) -> Iterator[Path]:
    """Copy every `far.*` log record into `<directory>/train.log` while the block runs."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_FILE
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("far")
    previous_level = root.level
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()


def _json_safe(value):
    # NaN/inf (e.g. Pearson of constant predictions) are not JSON: write null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (NaN and infinities become null)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(_json_safe(obj), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def require_finetune():
    """`far.finetune`, the training loop every training command runs (kept for far.llm.glue, which calls it)."""
    return far.finetune


def save_model(model, tokenizer, directory: Path) -> Path:
    """Save the fine-tuned model with `far.save_pretrained` (FAR layout kept) and the tokenizer beside it."""
    far.save_pretrained(model, directory)
    tokenizer.save_pretrained(directory)
    return directory


def print_metrics(label: str, metrics: Mapping[str, float]) -> None:
    """One line per metric on stdout, e.g. `cola (full): matthews_correlation = 0.4321`."""
    for name, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{label}: {name} = {shown}")
    sys.stdout.flush()


def fine_tune_and_report(
    args: argparse.Namespace,
    *,
    task: str,
    model,
    tokenizer,
    train_data,
    collate_fn,
    evaluator,
    hparams: Mapping,
    out: Path,
    write_predictions,
    extra: Mapping | None = None,
) -> dict:
    """Train with `far.finetune`, evaluate, then write predictions, the model and metrics.json; print the metrics.

    `write_predictions(out)` writes the evaluator's last predictions into the output folder and
    returns the file names it wrote. Returns the metrics record (what metrics.json holds).
    """
    kwargs = finetune_kwargs(args, hparams)
    with run_log(out):
        logger.info(
            "far %s: task %s, model %s, method %s, optimizer %s, %d training examples; hyper-parameters %s",
            args.command,
            task,
            args.model,
            args.method,
            args.optimizer,
            len(train_data),
            dict(hparams),
        )
        result = far.finetune(model, train_data, collate_fn=collate_fn, eval_fn=evaluator, output_dir=out, **kwargs)
        metrics = dict(result.metrics or {})
        if not metrics:  # finetune ran no final evaluation: do it here
            metrics = evaluator(model)
        logger.info("%s (%s): %s", task, args.method, metrics)
    files = {"log": LOG_FILE, **write_predictions(out)}
    if result.log_path:
        files["step_log"] = Path(result.log_path).name  # far.finetune's per-step JSON lines
    if not args.no_save_model:
        model_dir = Path(args.model_dir) if args.model_dir else out / "model"
        save_model(model, tokenizer, model_dir)
        files["model"] = str(model_dir)
    record = {
        "task": task,
        "method": args.method,
        "retention": kwargs["retention"],
        "selection": kwargs.get("selection"),
        "optimizer": args.optimizer,
        "model": args.model,
        **result.to_dict(),
        "metrics": metrics,
        "hyperparameters": {**hparams, **{k: kwargs[k] for k in RECORDED_OPTIONS}},
        **(extra or {}),
        "files": files,
        "far_version": far.__version__,
    }
    write_json(out / METRICS_FILE, record)
    print_metrics(f"{task} ({args.method})", metrics)
    print(f"wrote {out / METRICS_FILE}, predictions and the training log to {out}")
    return record
