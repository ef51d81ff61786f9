"""`far squad`: fine-tune for extractive QA on SQuAD and score exact match / F1.

Offline only SQuAD's dev file exists, so by default that file is split by article: the last
--holdout-articles (10) articles are evaluated on, the others trained on. --train-file uses a real
training file instead.

    far squad --method far --retention 0.4 --max-steps 500
"""

from __future__ import annotations

import argparse

from transformers import DataCollatorWithPadding

from far.cli.common import (
    add_data_arguments,
    add_training_arguments,
    describe_defaults,
    fine_tune_and_report,
    first,
    output_dir,
    resolve_hyperparameters,
)
from far.cli.evaluation import SquadEvaluator
from far.data.squad import DEFAULT_HOLDOUT_ARTICLES, VERSIONS, load_squad, squad_eval_dataset, squad_train_dataset
from far.data.squad_postprocess import write_predictions
from far.models import check_max_length, load_model_and_tokenizer

SQUAD_DEFAULTS = {
    "adamw": dict(lr=5e-5, epochs=2.0, max_steps=None, batch_size=16, max_length=384, warmup=0.1),
    "mezo": dict(lr=1e-5, epochs=None, max_steps=5000, batch_size=16, max_length=384, warmup=0.0),
}
PREDICTIONS_FILE = "predictions.json"
NULL_ODDS_FILE = "null_odds.json"


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


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "squad",
        help="fine-tune and evaluate on SQuAD",
        description="Fine-tune a model for extractive question answering on SQuAD and report exact match / F1. "
        "Local data: --data-dir or $FAR_DATA_DIR with squad/dev-v1.1.json (split by article).",
    )
    add_squad_arguments(parser)
    add_training_arguments(parser)
    parser.epilog = describe_defaults(SQUAD_DEFAULTS)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_data_arguments(parser)
    parser.set_defaults(func=run)


def load_eval_split(args: argparse.Namespace):
    """The SQuAD splits the arguments ask for (train/validation), the evaluation one cut to --max-eval-samples."""
    if args.n_best < 1 or args.max_answer_length < 1:
        raise ValueError(
            f"--n-best and --max-answer-length must be positive, got {args.n_best} and {args.max_answer_length}"
        )
    splits = load_squad(
        args.squad_version,
        args.data_dir,
        train_file=args.train_file,
        eval_file=args.eval_file,
        holdout_articles=args.holdout_articles,
    )
    return splits, first(splits["validation"], args.max_eval_samples)


def make_evaluator(args: argparse.Namespace, examples, tokenizer, max_length: int) -> SquadEvaluator:
    features = squad_eval_dataset(examples, tokenizer, max_length, args.doc_stride)
    return SquadEvaluator(
        examples,
        features,
        DataCollatorWithPadding(tokenizer),
        tokenizer.padding_side,
        batch_size=args.eval_batch_size,
        bf16=args.bf16,
        version_2=args.squad_version == "2.0",
        n_best=args.n_best,
        max_answer_length=args.max_answer_length,
    )


def write_squad_predictions(evaluator: SquadEvaluator, directory) -> dict[str, str]:
    files = {"predictions": PREDICTIONS_FILE}
    odds = None
    if evaluator.version_2:
        odds, files["null_odds"] = directory / NULL_ODDS_FILE, NULL_ODDS_FILE
    write_predictions(evaluator.predictions, directory / PREDICTIONS_FILE, odds)
    return files


def run(args: argparse.Namespace) -> int:
    hparams = resolve_hyperparameters(args, SQUAD_DEFAULTS)
    task = "squad" if args.squad_version == "1.1" else "squad_v2"
    out = output_dir(args, f"{task}-{args.method}")
    splits, eval_raw = load_eval_split(args)
    train_raw = first(splits["train"], args.max_train_samples)
    model, tokenizer = load_model_and_tokenizer(args.model, "question-answering", finetuning_task=task, seed=args.seed)
    check_max_length(model, hparams["max_length"])
    train = squad_train_dataset(train_raw, tokenizer, hparams["max_length"], args.doc_stride)
    evaluator = make_evaluator(args, eval_raw, tokenizer, hparams["max_length"])
    split = (
        "train file"
        if args.train_file
        else f"last {args.holdout_articles or DEFAULT_HOLDOUT_ARTICLES} articles held out"
    )
    fine_tune_and_report(
        args,
        task=task,
        model=model,
        tokenizer=tokenizer,
        train_data=train,
        collate_fn=DataCollatorWithPadding(tokenizer),
        evaluator=evaluator,
        hparams=hparams,
        out=out,
        write_predictions=lambda directory: write_squad_predictions(evaluator, directory),
        extra={
            "train_examples": len(train_raw),
            "train_features": len(train),
            "eval_examples": len(eval_raw),
            "eval_features": len(evaluator.features),
            "split": split,
            "doc_stride": args.doc_stride,
            "n_best": args.n_best,
            "max_answer_length": args.max_answer_length,
        },
    )
    return 0
