"""`far glue`: fine-tune and evaluate on a GLUE task.

Fine-tune a model on a GLUE task (full, FAR, random selection, frozen FFNs, LoRA) and score its dev set;
a causal LM (--model smollm2-135m or a .gguf file) is trained by prompts. Local data: --data-dir
or $FAR_DATA_DIR with glue/<Task>/{train,dev}.tsv.

far glue --task cola --method far --retention 0.4
far glue --task stsb --method full --optimizer mezo --max-steps 2000
far glue --task sst2 --model smollm2-135m --optimizer mezo   # a causal LM, trained by prompts
"""

from __future__ import annotations

import argparse

from far.cli.common import register_training_command, report, settings_from
from far.tasks.glue import GLUE_TASKS
from far.tasks.models import is_causal_lm
from far.tasks.prompted import prompted_run
from far.tasks.runs import glue_run
from far.tasks.settings import GLUE_DEFAULTS


def _add_task(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=list(GLUE_TASKS), help="GLUE task")


def register(subparsers: argparse._SubParsersAction) -> None:
    register_training_command(subparsers, __doc__, GLUE_DEFAULTS, run, _add_task)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    build = prompted_run if is_causal_lm(settings.model) else glue_run
    return report(build(settings, args.task))
