"""`far squad`: fine-tune and evaluate on SQuAD.

Fine-tune a model for extractive question answering on SQuAD and report exact match / F1. Local
data: squad/dev-v1.1.json (split by article) under --data-dir, else $FAR_DATA_DIR, else ../shared/data.

Offline only SQuAD's dev file exists, so by default that file is split by article: the last
--holdout-articles (10) articles are evaluated on, the others trained on. --train-file uses a real
training file instead.

    far squad --method far --retention 0.4 --max-steps 500
"""

from __future__ import annotations

import argparse

from far.cli.common import from_args, register_training_command, report, settings_from
from far.data.locate import locate_data_dir
from far.data.squad import DEFAULT_HOLDOUT_ARTICLES, VERSIONS
from far.recipes.runs import SquadSettings, squad_run
from far.recipes.settings import SQUAD_DEFAULTS


def add_squad_arguments(parser: argparse.ArgumentParser, version: bool = True) -> None:
    """Data and post-processing arguments shared by `far squad` and `far eval` on a SQuAD model."""
    if version:
        parser.add_argument(
            "--version", dest="squad_version", choices=list(VERSIONS), default="1.1", help="SQuAD version"
        )
    parser.add_argument(
        "--eval-file", default=None, help="SQuAD JSON to evaluate on (default: dev-v<version>.json under --data-dir)"
    )
    parser.add_argument(
        "--train-file", default=None, help="SQuAD JSON to train on; without it the evaluation file is split by article"
    )
    parser.add_argument(
        "--holdout-articles",
        type=int,
        default=None,
        help=f"articles of the evaluation file held out for evaluation, the rest trained on "
        f"(default: {DEFAULT_HOLDOUT_ARTICLES}, when there is no --train-file)",
    )
    parser.add_argument("--doc-stride", type=int, default=128, help="overlap of a long context's windows (tokens)")
    parser.add_argument("--n-best", type=int, default=20, help="start/end candidates per window")
    parser.add_argument("--max-answer-length", type=int, default=30, help="longest answer (tokens)")


def squad_settings(args: argparse.Namespace, version: str) -> SquadSettings:
    return from_args(SquadSettings, args, version=version)


def register(subparsers: argparse._SubParsersAction) -> None:
    register_training_command(subparsers, __doc__, SQUAD_DEFAULTS, run, add_squad_arguments)


def run(args: argparse.Namespace) -> int:
    if args.eval_file is None:  # before anything loads: without data the run stops here, saying what to pass
        root = locate_data_dir(args.data_dir, needs=f"squad/{VERSIONS[args.squad_version][1]}")
        args.data_dir = None if root is None else str(root)
    settings = settings_from(args)
    return report(squad_run(settings, squad_settings(args, args.squad_version)))
