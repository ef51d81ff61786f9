"""`far predict`: label texts with a fine-tuned model (a saved folder, or a base model plus a learners file).

far predict --model runs/reviews-far/model --input new.csv --output predictions.csv
echo "What a lovely film." | far predict --model runs/reviews-far/model
far predict --model minilm --learners runs/reviews-random/learners.safetensors --input new.jsonl --output out.jsonl
"""

from __future__ import annotations

import argparse
import sys

from far.recipes.predict import Predictor, check_output, format_rows, model_card, read_inputs, write_predictions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="label texts with a fine-tuned model",
        description="Predict a label and its score for every input row, with a model a training run saved "
        "(e.g. runs/reviews-far/model) or a base model plus a learners file. Input: a CSV/TSV/JSON/JSONL file "
        "with the training run's text columns, or stdin, one text per line (a pair: two tab-separated texts). "
        "Output: CSV or JSON Lines by the file's suffix; JSON Lines on stdout without --output.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="a saved model folder; with --learners, its base")
    parser.add_argument("--learners", default=None, metavar="FILE", help="a learners file to apply to --model")
    parser.add_argument("--input", default="-", metavar="F", help="a .csv/.tsv/.json/.jsonl file, or - for stdin")
    parser.add_argument("--output", default=None, metavar="F", help="a .csv or .jsonl file (default: stdout, JSONL)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text (default: 128)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the request fails before the weights load and before any output.
    if args.output is not None:
        check_output(args.output)
    card = model_card(args.model, args.learners)
    rows = read_inputs(sys.stdin if args.input == "-" else args.input, card.text_columns)
    predictor = Predictor.load(
        args.model, learners=args.learners, max_length=args.max_length, batch_size=args.batch_size
    )
    results = predictor(rows)
    if args.output is None:
        sys.stdout.write(format_rows(results, ".jsonl"))
    else:
        path = write_predictions(results, args.output)
        print(f"wrote {len(results)} predictions to {path}", file=sys.stderr)
    return 0
