"""`far glue`: fine-tune on a GLUE task (full, FAR, random selection or frozen FFNs) and score its dev set.

far glue --task cola --method far --retention 0.4
far glue --task stsb --method full --optimizer mezo --max-steps 2000
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
from far.cli.evaluation import GlueEvaluator
from far.data.glue import GLUE_TASKS, load_glue, tokenize_glue
from far.models import check_max_length, load_model_and_tokenizer

# Per optimizer, for MiniLM-size encoders (small models take a higher AdamW rate than BERT-base's 2e-5..5e-5).
# MeZO needs many cheap steps with a small learning rate.
GLUE_DEFAULTS = {
    "adamw": dict(lr=1e-4, epochs=3.0, max_steps=None, batch_size=32, max_length=128, warmup=0.06),
    "mezo": dict(lr=1e-5, epochs=None, max_steps=5000, batch_size=16, max_length=128, warmup=0.0),
}
PREDICTIONS_FILE = "predictions.tsv"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "glue",
        help="fine-tune and evaluate on a GLUE task",
        description="Fine-tune a model on a GLUE task (full, FAR, random selection, frozen FFNs) and score its "
        "dev set. Local data: --data-dir or $FAR_DATA_DIR with glue/<Task>/{train,dev}.tsv.",
    )
    parser.add_argument("--task", required=True, choices=list(GLUE_TASKS), help="GLUE task")
    add_training_arguments(parser)
    parser.epilog = describe_defaults(GLUE_DEFAULTS)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_data_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    task = GLUE_TASKS[args.task]
    # --- issue 7: a causal LM (--model smollm2-135m, a .gguf file) trains by prompts, see far/llm/glue.py ---
    from far.llm.glue import is_prompted_model, run_prompted

    if is_prompted_model(args.model):
        return run_prompted(args, task)
    # --- end issue 7 ---
    hparams = resolve_hyperparameters(args, GLUE_DEFAULTS)
    out = output_dir(args, f"{task.name}-{args.method}")
    # Everything the user can get wrong is checked here, before any training.
    splits = load_glue(task.name, args.data_dir)
    train_raw = first(splits["train"], args.max_train_samples)
    dev_raw = first(splits["validation"], args.max_eval_samples)
    model, tokenizer = load_model_and_tokenizer(
        args.model,
        task.kind,
        task.num_labels,
        label_names=task.label_names or None,
        finetuning_task=task.name,
        seed=args.seed,
    )
    check_max_length(model, hparams["max_length"])
    train = tokenize_glue(train_raw, tokenizer, task, hparams["max_length"])
    dev = tokenize_glue(dev_raw, tokenizer, task, hparams["max_length"])
    collate = DataCollatorWithPadding(tokenizer)
    evaluator = GlueEvaluator(task, dev, collate, batch_size=args.eval_batch_size, bf16=args.bf16)

    def write_predictions(directory):
        evaluator.write_predictions(directory / PREDICTIONS_FILE, dev_raw["idx"])
        return {"predictions": PREDICTIONS_FILE}

    fine_tune_and_report(
        args,
        task=task.name,
        model=model,
        tokenizer=tokenizer,
        train_data=train,
        collate_fn=collate,
        evaluator=evaluator,
        hparams=hparams,
        out=out,
        write_predictions=write_predictions,
        extra={"train_examples": len(train_raw), "eval_examples": len(dev_raw)},
    )
    return 0
