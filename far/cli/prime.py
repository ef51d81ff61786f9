"""`far prime`: run FAR's priming alone and write what it chose, a layout other users of the base can share.

Runs only the priming phase of the run that far glue or far train would make with the same flags (data, schedule,
seed, configuration) and writes what priming chose to --output: each layer's learner nodes, the frozen depth and
the retention, with the base's fingerprint, the task and the configuration. far train/glue --layout FILE then
trains other users' data with it from the first step, with no priming of their own.

far prime --task sst2 --output layout.safetensors
far prime --train-file user0.csv --output layout.safetensors
far train --train-file user1.csv --validation-file dev.csv --layout layout.safetensors
"""

from __future__ import annotations

import argparse
import importlib
import json

from far.cli.common import UsageError, register_training_command, settings_from
from far.cli.glue import GLUE_TASK_NAMES
from far.cli.train import DEFAULT_LABEL_COLUMN
from far.data.locate import GLUE_LAYOUT, locate_data_dir
from far.models import is_causal_lm
from far.recipes.settings import GLUE_DEFAULTS
from far.saving.layout_file import check_layout_output

# Training flags that say where a run writes or how it goes on: far prime writes the layout alone.
_NOT_HERE = {
    "output_dir": "--output-dir",
    "model_dir": "--model-dir",
    "checkpoint_every": "--checkpoint-every",
    "resume": "--resume",
    "memory_budget": "--memory-budget",
    "layout": "--layout",
}


def _add_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="the layout file to write (e.g. layout.safetensors)"
    )
    parser.add_argument("--task", choices=list(GLUE_TASK_NAMES), default=None, help="a GLUE task's training split")
    parser.add_argument("--train-file", default=None, help="or your own examples (.csv, .tsv, .json or .jsonl)")
    parser.add_argument(
        "--validation-file", default=None, help="with --train-file: more rows to read the class names from"
    )
    parser.add_argument(
        "--text-column", nargs="+", action="extend", default=None, metavar="C", help="with --train-file, as far train's"
    )
    parser.add_argument(
        "--label-column", default=DEFAULT_LABEL_COLUMN, help=f"with --train-file (default: {DEFAULT_LABEL_COLUMN})"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    register_training_command(subparsers, __doc__, GLUE_DEFAULTS, run, _add_data)


def _check(args: argparse.Namespace) -> None:
    if (args.task is None) == (args.train_file is None):
        raise UsageError("give the data priming steps over: --task T (a GLUE task) or --train-file F, one of them")
    if args.method != "far" or is_causal_lm(args.model):
        raise UsageError("far prime primes FAR's surgery of an encoder: --method far (the default), an encoder model")
    given = [flag for name, flag in _NOT_HERE.items() if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(f"far prime writes the layout alone (--output): drop {' '.join(given)}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    output = check_layout_output(args.output, args.overwrite)  # before anything loads
    if args.task is not None:  # without data the run stops here, saying what to pass
        root = locate_data_dir(args.data_dir, needs=GLUE_LAYOUT)
        args.data_dir = None if root is None else str(root)
    settings = settings_from(args)
    if args.task is not None:
        training = importlib.import_module("far.recipes.runs").glue_run(settings, args.task, check_output=False)
    else:
        validation = args.validation_file or args.train_file
        files = importlib.import_module("far.data.files").load_text_files(
            args.train_file, validation, text_columns=args.text_column, label_column=args.label_column
        )
        training = importlib.import_module("far.recipes.files_run").text_files_run(settings, files, check_output=False)
    layout = importlib.import_module("far.recipes.priming").prime_and_write(training, output, overwrite=args.overwrite)
    record, shares = layout.record, json.loads(layout.metadata["retention"]).values()
    print(
        f"primed {record['priming_steps']} of {record['total_steps']} steps on {record['train_examples']} examples: "
        f"{layout.frozen_layers} bottom layers frozen, learner shares {min(shares):.3f} to {max(shares):.3f}"
    )
    print(f"wrote {output} (sha256 {layout.digest[:16]}...); train with it: far train/glue --layout {output}")
    return 0
