"""`far glue`: fine-tune and evaluate on a GLUE task.

Fine-tune a model on a GLUE task (full, FAR, random selection, frozen FFNs, LoRA) and score its dev set;
a causal LM (--model smollm2-135m, gemma3-270m or a .gguf file) is trained by prompts with MeZO on
the lean runtime. Local data: glue/<Task>/{train,dev}.tsv under --data-dir, else $FAR_DATA_DIR, else
../shared/data.

far glue --task cola --method far --retention 0.4
far glue --task stsb --method full --optimizer mezo --max-steps 2000
far glue --task sst2 --model smollm2-135m --optimizer mezo   # a causal LM, trained by prompts
"""

from __future__ import annotations

import argparse
import importlib

from far.cli.common import print_metrics, register_training_command, report, settings_from
from far.data.locate import GLUE_LAYOUT, locate_data_dir
from far.models import is_causal_lm
from far.recipes.settings import GLUE_DEFAULTS

# The task names, without importing far.data.glue's `datasets` into a causal LM's run.
GLUE_TASK_NAMES = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")


def _add_task(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=list(GLUE_TASK_NAMES), help="GLUE task")


def register(subparsers: argparse._SubParsersAction) -> None:
    register_training_command(subparsers, __doc__, GLUE_DEFAULTS, run, _add_task)


def run(args: argparse.Namespace) -> int:
    # Before anything loads: without data the run stops here, saying what to pass (the lean runtime reads files only).
    root = locate_data_dir(args.data_dir, needs=GLUE_LAYOUT, hub=not is_causal_lm(args.model))
    args.data_dir = None if root is None else str(root)
    settings = settings_from(args)
    if is_causal_lm(settings.model):
        # The lean runtime is loaded by name so that an encoder's run does not import it, nor it
        # the encoders' `datasets` and transformers model code (far.lazy says why).
        lean = importlib.import_module("far.recipes.causal_lm")
        record = lean.lean_prompted_run(settings, args.task)
        print_metrics(f"{args.task} ({settings.method}, prompts)", record["metrics"])
        print(f"wrote {settings.output_path(args.task) / 'metrics.json'} and predictions")
        return 0
    runs = importlib.import_module("far.recipes.runs")
    return report(runs.glue_run(settings, args.task))
