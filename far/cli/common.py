"""What the `far` commands share: their arguments, the registration of a training command, printing.

A training command is `register_training_command(...)` plus a `run(args)` that builds a
`far.recipes.TrainingRun` from `settings_from(args)` and hands it to `train_and_report` through
`report(...)`; the training itself, the files and the metrics record are the tasks layer's. The
arguments themselves are `far.cli.arguments`'; which FAR configuration they make is
`far.recipes.configuration`'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TypeVar

from far.cli.arguments import add_data_arguments, add_training_arguments
from far.models import resolve_model
from far.recipes.configuration import FLAGS, choose_configuration
from far.recipes.report import METRICS_FILE, TrainingRun, train_and_report
from far.recipes.settings import RunSettings
from far.saving.layout_file import read_shared_layout
from far.training.budget import (
    BASE_MIB,
    DATASETS_MIB,
    DYNAMO_MIB,
    MemoryBudgetError,
    MemoryPlan,
    ModelShape,
    imports_dynamo,
    peak_rss_mib,
    plan_run_memory,
)
from far.training.memory import release_freed_memory

T = TypeVar("T")


class UsageError(Exception):
    """A mistake in what the user asked for; `far` prints it as `far <cmd>: error: <message>` and exits 2."""


def describe_defaults(defaults: Mapping[str, Mapping]) -> str:
    """The per-optimizer defaults as help text, e.g. "adamw: lr 5e-05, epochs 3.0, ..."."""
    lines = ["defaults per optimizer (override with the flags):"]
    for optimizer, values in defaults.items():
        shown = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in values.items() if v is not None)
        lines.append(f"  {optimizer}: {shown}")
    return "\n".join(lines)


def register_training_command(
    subparsers: argparse._SubParsersAction,
    doc: str,
    defaults: Mapping[str, Mapping],
    run: Callable[[argparse.Namespace], int],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.ArgumentParser:
    """Add a training command: its own arguments first, then the training and data arguments.

    `doc` is the command module's docstring: "`far <name>`: <help>.", then a paragraph that
    becomes the description.
    """
    title, description = (doc.split("\n\n") + [""])[:2]
    name, _, help = title.strip().removeprefix("`far ").partition("`: ")
    parser = subparsers.add_parser(
        name,
        help=help.rstrip("."),
        description=" ".join(description.split()) or help,
        epilog=describe_defaults(defaults),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if add_arguments is not None:
        add_arguments(parser)
    add_training_arguments(parser)
    add_data_arguments(parser)
    parser.set_defaults(func=run, task_defaults=defaults)
    return parser


def from_args(cls: type[T], args: argparse.Namespace, **given: object) -> T:
    """A settings dataclass from the arguments that share its fields' names, and `given`."""
    named = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name) and f.name not in given}
    return cls(**named, **given)


def configured(args: argparse.Namespace, memory_budget: float | None) -> dict:
    """The run's configuration fields and the `Configuration` they make, from the flags as given
    (`far.recipes.configuration`: --method far with none of them is FAR's automatic configuration)."""
    given = {name: getattr(args, name) for name in FLAGS}
    layout = None if getattr(args, "layout", None) is None else read_shared_layout(args.layout)
    fields, configuration = choose_configuration(
        given, preset=args.preset, method=args.method, model=args.model, memory_budget=memory_budget, layout=layout
    )
    return {**fields, "configuration": configuration}


def settings_from(args: argparse.Namespace, **given: object) -> RunSettings:
    """The `RunSettings` of a training command's arguments (checked: a bad value raises ValueError); `given`
    replaces arguments."""
    budget = given.get("memory_budget", args.memory_budget)
    settings = from_args(
        RunSettings,
        args,
        save_model=not args.no_save_model,
        progress=not args.no_progress,
        **configured(args, budget),
        **given,
    )
    chosen = settings.configuration
    if chosen is not None and chosen.name != "none":
        print(f"configuration: {chosen.name} ({chosen.why})", flush=True)
    if settings.memory_budget is not None:
        # GLUE's and SQuAD's loaders import `datasets`; far train reads its files without it.
        settings = _within_budget(settings, args.task_defaults, reads_datasets=args.command in ("glue", "squad"))
    return settings


def budget_plan(settings: RunSettings, defaults: Mapping[str, Mapping], reads_datasets: bool) -> MemoryPlan | None:
    """The memory plan of a run, from the model's config.json alone, before anything loads (None: a hub name
    not yet downloaded, which far.finetune plans once the model is there). Raises MemoryBudgetError."""
    options = settings.train_options(settings.hyperparameters(defaults))
    try:
        folder = resolve_model(settings.model)
        shape = ModelShape.from_folder(folder)
    except (OSError, ValueError):
        return None
    base = BASE_MIB[settings.encoder_runtime] + (DATASETS_MIB if reads_datasets else 0.0)
    if imports_dynamo(options.optimizer) and settings.encoder_runtime == "lean":
        base += DYNAMO_MIB  # transformers' model code imports it anyway; the lean runtime only with the optimizer
    primer_copy = not (Path(folder) / "model.safetensors").is_file()
    return plan_run_memory(options, shape, base_mib=base, seq_len=options.max_length, primer_copy=primer_copy)


def _within_budget(settings: RunSettings, defaults: Mapping[str, Mapping], reads_datasets: bool) -> RunSettings:
    """Refuse a budget that cannot fit before anything loads, and shrink the evaluation batch to the plan's;
    far.finetune plans the training side again with the model loaded and the examples' real lengths."""
    # From here on, freed tensors go back to the system: the peak is what is live (far.training.memory).
    release_freed_memory()
    try:
        plan = budget_plan(settings, defaults, reads_datasets)
    except MemoryBudgetError as e:
        raise UsageError(str(e)) from None
    if plan is None:
        return settings
    print(
        f"memory budget {plan.budget_mib} MiB: fits on the {settings.encoder_runtime} runtime (at most "
        f"{plan.estimate_mib} MiB before loading, every example at {plan.seq_len} tokens); evaluation batch "
        f"{plan.eval_batch_size}",
        flush=True,
    )
    return replace(settings, eval_batch_size=plan.eval_batch_size)


def print_metrics(label: str, metrics: Mapping[str, float]) -> None:
    """One line per metric on stdout, e.g. `cola (full): matthews_correlation = 0.4321`."""
    for name, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{label}: {name} = {shown}")
    sys.stdout.flush()


def report(run: TrainingRun) -> int:
    """Train and report `run` (`far.recipes.train_and_report`), then print its metrics and where it wrote."""
    record = train_and_report(run)
    if record is None:  # a process of a distributed run other than the first, which reports
        return 0
    print_metrics(run.title, record["metrics"])
    out: Path = run.output_dir
    print(f"wrote {out / METRICS_FILE}, predictions and the training log to {out}")
    budget = run.settings.memory_budget
    kept = record.get("frozen_cache_bytes") or 0
    notes = ([] if budget is None else [f"budget {budget:g} MiB"]) + (
        [f"{kept / 2**20:.0f} MiB of it the frozen bottom's kept states"] if kept else []
    )
    print(f"peak RSS {peak_rss_mib()} MiB" + (f" ({'; '.join(notes)})" if notes else ""), flush=True)
    return 0
