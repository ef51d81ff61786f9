"""`far predict`: label texts with a fine-tuned model (a saved folder, or a base model plus a learners file).

far predict --model runs/reviews-minilm-far/model --input new.csv --output predictions.csv
echo "What a lovely film." | far predict --model runs/reviews-minilm-far/model
far predict --model minilm --learners runs/reviews-minilm-random/learners.safetensors --input new.jsonl
far predict --model minilm --learners users/ --input new.csv --output-dir predictions/   # one file per user

With several users, a learners file that is refused is reported and skipped: the others' predictions are
written, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from far.recipes.predict import (
    OUTPUT_FORMATS,
    Predictor,
    check_output,
    format_rows,
    model_card,
    read_inputs,
    write_predictions,
)
from far.recipes.users import learners_files, predict_users, user_output
from far.storage import lock


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="label texts with a fine-tuned model",
        description="Predict a label and its score for every input row, with a model a training run saved "
        "(e.g. runs/reviews-minilm-far/model) or a base model plus a learners file. Input: a CSV/TSV/JSON/JSONL file "
        "with the training run's text columns, or stdin, one text per line (a pair: two tab-separated texts). "
        "Output: CSV or JSON Lines by the file's suffix; JSON Lines on stdout without --output.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="a saved model folder; with --learners, its base")
    parser.add_argument(
        "--learners",
        nargs="+",
        default=None,
        metavar="FILE",
        help="learners files to apply to --model, or folders of them: several users are served from one process, "
        "each file swapped in place (needs --output-dir)",
    )
    parser.add_argument("--input", default="-", metavar="F", help="a .csv/.tsv/.json/.jsonl file, or - for stdin")
    parser.add_argument("--output", default=None, metavar="F", help="a .csv or .jsonl file (default: stdout, JSONL)")
    parser.add_argument(
        "--output-dir", default=None, metavar="DIR", help="with several learners files: <DIR>/<file name>.<format>"
    )
    parser.add_argument(
        "--format", choices=[s.lstrip(".") for s in OUTPUT_FORMATS], default="jsonl", help="with --output-dir"
    )
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text (default: 128)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the request fails before the weights load and before any output.
    if args.output is not None:
        check_output(args.output)
    files = learners_files(args.learners) if args.learners else []
    if len(files) > 1 or args.output_dir is not None:
        return _run_users(args, files)
    learners = files[0] if files else None
    card = model_card(args.model, learners)
    rows = read_inputs(sys.stdin if args.input == "-" else args.input, card.text_columns)
    predictor = Predictor.load(
        args.model, learners=learners, card=card, max_length=args.max_length, batch_size=args.batch_size
    )
    results = predictor(rows)
    if args.output is None:
        sys.stdout.write(format_rows(results, ".jsonl"))
    else:
        path = write_predictions(results, args.output)
        print(f"wrote {len(results)} predictions to {path}", file=sys.stderr)
    return 0


def _run_users(args: argparse.Namespace, files: list) -> int:
    """Every user's predictions to --output-dir; a file that fails is reported and skipped (exit code 1)."""
    if args.output_dir is None or args.output is not None or not files:
        raise ValueError("several users' predictions go to --output-dir DIR (one file each), with --learners FILES")
    if args.input != "-" and not Path(args.input).is_file():
        raise ValueError(f"--input {args.input!r}: no such file; give a .csv/.tsv/.json/.jsonl file, or - for stdin")
    suffix = f".{args.format}"
    lock.hold(args.output_dir)

    def said(path: Path, info: dict, _predictor) -> None:  # as each user is done: many users take minutes
        swap = "" if info["swap_seconds"] is None else f" (swapped in {info['swap_seconds'] * 1e3:.0f} ms)"
        print(f"wrote {info['rows']} predictions to {path}{swap}", file=sys.stderr, flush=True)

    served = predict_users(
        args.model,
        files,
        sys.stdin if args.input == "-" else args.input,
        output_dir=args.output_dir,
        suffix=suffix,
        max_length=args.max_length,
        batch_size=args.batch_size,
        on_written=said,
    )
    for path, reason in served.failed.items():
        stale = user_output(args.output_dir, path, suffix)
        earlier = f" ({stale} is from an earlier run)" if stale.exists() else ""
        print(f"far predict: skipped {path}, no predictions written for it{earlier}: {reason}", file=sys.stderr)
    if not served.written:
        raise ValueError(f"no user's predictions were written: all {len(files)} learners file(s) failed (above)")
    if served.failed:
        print(f"far predict: {len(served.failed)} of {len(files)} learners files failed (above)", file=sys.stderr)
    return 1 if served.failed else 0
