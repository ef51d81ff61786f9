"""`far train`: fine-tune on your own CSV, TSV, JSON or JSONL files.

Fine-tune a model (full, FAR, random selection, frozen FFNs, LoRA; AdamW or MeZO) on a training file and
score it on a validation file, as transformers' run_glue.py does with --train_file/--validation_file:
one or two text columns (default: sentence1/sentence2, else the other column, else sentence or text)
and a label column (default: label). Text labels become classes (saved as the model's id2label),
whole numbers class ids, numbers with a fraction mean regression. Metrics: accuracy and macro-F1, or
Pearson and Spearman. Outputs as far glue's: metrics.json, predictions, the model, the learners file.

far train --train-file examples/reviews/train.csv --validation-file examples/reviews/dev.csv
far train --train-file pairs.jsonl --validation-file dev.jsonl --text-column premise hypothesis --label-column gold
"""

from __future__ import annotations

import argparse

from far.cli.common import register_training_command, report, settings_from
from far.data.files import DEFAULT_LABEL_COLUMN, load_text_files
from far.recipes.files_run import text_files_run
from far.recipes.settings import FILE_DEFAULTS


def _add_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-file", required=True, help="training examples (.csv, .tsv, .json or .jsonl)")
    parser.add_argument("--validation-file", required=True, help="examples to score the model on (same columns)")
    parser.add_argument(
        "--text-column",
        nargs="+",
        action="extend",
        default=None,
        metavar="C",
        help="one or two text columns (default: sentence1 sentence2, else the one other column, else sentence/text)",
    )
    parser.add_argument(
        "--label-column", default=DEFAULT_LABEL_COLUMN, help=f"the labels' column (default: {DEFAULT_LABEL_COLUMN})"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    register_training_command(subparsers, __doc__, FILE_DEFAULTS, run, _add_files)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)  # bad settings fail first, then bad files, before any model loads
    files = load_text_files(
        args.train_file, args.validation_file, text_columns=args.text_column, label_column=args.label_column
    )
    return report(text_files_run(settings, files))
