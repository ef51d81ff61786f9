"""`far eval`: score a saved fine-tuned model (plain or FAR) on its GLUE or SQuAD dev data.

far eval --checkpoint runs/cola-minilm-far/model
far eval --checkpoint runs/squad-minilm-far/model --holdout-articles 10 --output-dir runs/squad-minilm-far/eval
far eval --checkpoint runs/notes-smollm2-135m-far --text-file letter.txt   # a causal LM's run on texts: perplexity
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import far
from far.cli.arguments import add_data_arguments
from far.cli.common import UsageError, print_metrics
from far.cli.squad import add_squad_arguments, squad_settings
from far.data.glue import GLUE_TASKS, load_glue
from far.data.locate import locate_data_dir
from far.models import check_max_length, load_trained_model
from far.recipes.report import write_json
from far.recipes.runs import glue_evaluator, squad_evaluator
from far.recipes.settings import first
from far.recipes.text_scores import is_text_run, text_perplexity

SQUAD_TASKS = {"squad": "1.1", "squad_v2": "2.0"}
EVAL_METRICS_FILE = "eval_metrics.json"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a saved fine-tuned model",
        description="Score a model saved by `far glue`/`far squad` (or any far.save_pretrained folder) on its task's "
        "dev data. The task defaults to the one recorded in the checkpoint's config.",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="model folder (e.g. runs/cola-minilm-far/model); for a causal LM trained on texts, the run's folder",
    )
    parser.add_argument(
        "--text-file",
        default=None,
        help="a causal LM's run on texts: the perplexity of this text (a .txt/.md/.jsonl file or a folder of them)",
    )
    parser.add_argument(
        "--task",
        choices=[*GLUE_TASKS, *SQUAD_TASKS],
        default=None,
        help="task to score (default: the checkpoint's config.finetuning_task)",
    )
    parser.add_argument(
        "--max-length", type=int, default=None, help="tokens per sequence (default: 128 GLUE, 384 SQuAD)"
    )
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    parser.add_argument("--output-dir", default=None, help="also write eval_metrics.json and predictions here")
    add_data_arguments(parser)
    add_squad_arguments(parser, version=False)
    parser.set_defaults(func=run)


def _score_text(args: argparse.Namespace, checkpoint: Path) -> int:
    if args.text_file is None:
        raise UsageError(f"{checkpoint} is a causal LM's run on texts: give --text-file, the text to score")
    start = time.perf_counter()
    scores = text_perplexity(
        checkpoint, args.text_file, batch_size=min(args.eval_batch_size, 8), max_length=args.max_length
    )
    print_metrics(f"{args.text_file} ({checkpoint})", scores)
    if args.output_dir:
        out = Path(args.output_dir)
        record = {"checkpoint": str(checkpoint), "text_file": str(args.text_file), "metrics": scores}
        write_json(out / EVAL_METRICS_FILE, {**record, "eval_seconds": time.perf_counter() - start})
        print(f"wrote {out / EVAL_METRICS_FILE}")
    return 0


def run(args: argparse.Namespace) -> int:
    checkpoint = Path(args.checkpoint)
    if is_text_run(checkpoint):
        return _score_text(args, checkpoint)
    if args.text_file is not None:
        raise UsageError(f"--text-file scores a causal LM's run on texts; {checkpoint} is not one")
    if args.eval_file is None:  # before the model loads: without data the run stops here, saying what to pass
        root = locate_data_dir(args.data_dir)
        args.data_dir = None if root is None else str(root)
    model, tokenizer = load_trained_model(checkpoint)
    task = args.task or getattr(model.config, "finetuning_task", None)
    if task not in GLUE_TASKS and task not in SQUAD_TASKS:
        raise UsageError(
            f"the checkpoint does not record a known task (config.finetuning_task is {task!r}); "
            f"pass --task, one of {', '.join([*GLUE_TASKS, *SQUAD_TASKS])}"
        )
    max_length = args.max_length or (384 if task in SQUAD_TASKS else 128)
    check_max_length(model, max_length)
    start = time.perf_counter()
    if task in SQUAD_TASKS:
        if not type(model).__name__.endswith("ForQuestionAnswering"):
            raise UsageError(f"{checkpoint} holds a {type(model).__name__}, not a question-answering model")
        squad = squad_settings(args, SQUAD_TASKS[task])
        examples = first(squad.splits(args.data_dir)["validation"], args.max_eval_samples)
        evaluator = squad_evaluator(
            squad, examples, tokenizer, max_length, batch_size=args.eval_batch_size, bf16=args.bf16
        )
    else:
        spec = GLUE_TASKS[task]
        if model.config.num_labels != spec.num_labels:
            raise UsageError(
                f"{checkpoint} has {model.config.num_labels} output(s) but GLUE {task} needs "
                f"{spec.num_labels}; pass the --task it was trained on"
            )
        examples = first(load_glue(task, args.data_dir, splits=("validation",))["validation"], args.max_eval_samples)
        evaluator = glue_evaluator(
            spec, examples, tokenizer, max_length, batch_size=args.eval_batch_size, bf16=args.bf16
        )
    metrics = evaluator(model)
    seconds = time.perf_counter() - start
    print_metrics(f"{task} ({checkpoint})", metrics)
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = evaluator.write_predictions(out)
        far_config = far.get_config(model)
        write_json(
            out / EVAL_METRICS_FILE,
            {
                "task": task,
                "checkpoint": str(checkpoint),
                "metrics": metrics,
                "eval_seconds": seconds,
                "eval_examples": len(examples),
                "far": far_config.to_dict() if far_config is not None else None,
                "files": files,
                "far_version": far.__version__,
            },
        )
        print(f"wrote {out / EVAL_METRICS_FILE}")
    return 0
