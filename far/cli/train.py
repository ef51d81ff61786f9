"""`far train`: fine-tune on your own CSV, TSV, JSON or JSONL files, or a causal LM on your own texts.

Fine-tune a model (full, FAR, random selection, frozen FFNs, LoRA; AdamW or MeZO) on a training file and
score it on a validation file, as transformers' run_glue.py does with --train_file/--validation_file:
one or two text columns (default: sentence1/sentence2, else the other column, else sentence or text)
and a label column (default: label). Text labels become classes (saved as the model's id2label),
whole numbers class ids, numbers with a fraction mean regression. Metrics: accuracy and macro-F1, or
Pearson and Spearman. Outputs as far glue's: metrics.json, predictions, the model, the learners file.
With a causal LM (--model smollm2-135m, gemma3-270m or a .gguf file) the training file is your own text
(a folder of .txt/.md/.jsonl files, or one), trained with the next-token loss and scored by held-out
perplexity; without --validation-file a tenth of it is held out.

far train --train-file examples/reviews/train.csv --validation-file examples/reviews/dev.csv
far train --train-file pairs.jsonl --validation-file dev.jsonl --text-column premise hypothesis --label-column gold
far train --model smollm2-135m --train-file notes/ --optimizer mezo   # a causal LM on your own texts
"""

from __future__ import annotations

import argparse
import importlib

from far.cli.common import UsageError, print_metrics, register_training_command, report, settings_from
from far.hardware import peak_rss_bytes
from far.models import is_causal_lm
from far.recipes.settings import FILE_DEFAULTS

DEFAULT_LABEL_COLUMN = "label"  # far.data.files' default, named here without importing the table readers


def _add_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--train-file",
        required=True,
        help="training examples (.csv, .tsv, .json or .jsonl); for a causal LM, texts (a folder of .txt/.md/.jsonl "
        "files, or one)",
    )
    parser.add_argument(
        "--validation-file",
        default=None,
        help="examples to score the model on (same columns); required, except for a causal LM, where a tenth of the "
        "training texts is held out without it",
    )
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


def _train_on_texts(args: argparse.Namespace) -> int:
    # Loaded by name, as far glue loads the lean runtime: an encoder's run does not import it, nor it the table readers.
    own_texts = importlib.import_module("far.recipes.own_texts")
    # The budget is planned from the GGUF file by the run itself (far.llm.text_budget), not as an encoder's.
    settings = settings_from(args, memory_budget=None)
    texts = own_texts.TextRun(args.train_file, args.validation_file, memory_budget=args.memory_budget)
    record = own_texts.own_texts_run(settings, texts)
    if record is None:  # a process of a torchrun run other than the first, which reports
        return 0
    before, after = record["before"], record["metrics"]
    print_metrics(f"{texts.name} ({settings.method}, {settings.optimizer})", after)
    print(
        f"held-out perplexity {before['perplexity']:.3f} -> {after['perplexity']:.3f} "
        f"({100 * record['perplexity_change']:+.1f}%), token accuracy {before['token_accuracy']:.4f} -> "
        f"{after['token_accuracy']:.4f}"
    )
    out = settings.output_path(texts.name)
    print(f"wrote {out / 'metrics.json'}, the training log and {', '.join(record['files'].values())} to {out}")
    print(f"peak RSS {peak_rss_bytes() // 2**20} MiB", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    if is_causal_lm(args.model):
        return _train_on_texts(args)
    if args.validation_file is None:
        raise UsageError("--validation-file is required (except for a causal LM trained on texts)")
    settings = settings_from(args)  # bad settings fail first, then bad files, before any model loads
    files = importlib.import_module("far.data.files").load_text_files(
        args.train_file, args.validation_file, text_columns=args.text_column, label_column=args.label_column
    )
    return report(importlib.import_module("far.recipes.files_run").text_files_run(settings, files))
