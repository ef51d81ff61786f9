"""`far glue` with a causal LM (`--model smollm2-135m` or a `.gguf` file): prompt-based classification.

The task becomes a prompt and one label word per class (SST-2: `<sentence> It was` + ` great` /
` terrible`), scored from the LM's logits of the label words at the prompt's end, as in MeZO. Run in
the memory of inference: weights stay memory-mapped where they are only read, the frozen embedding
keeps only the rows in use resident, and FAR's priming is gradient priming (`far.llm.priming`)
rather than AdamW steps. With a causal LM, `--method far|random` always freezes the embeddings (the
tied LM head with them: 21% of SmolLM2's weights), and `--priming` counts gradient-priming batches
(a fraction of the steps, at most 16 batches, or a number), each run in micro-batches of 4.

Hooked into `far/cli/glue.py`'s `run` (one delimited block there), before anything loads.
"""

from __future__ import annotations

import argparse
import csv
import gc
import logging
import math
import os
from pathlib import Path

import far
from far.atomic import atomic_file
from far.cli.common import (
    METRICS_FILE,
    UsageError,
    finetune_kwargs,
    first,
    output_dir,
    print_metrics,
    require_finetune,
    resolve_hyperparameters,
    run_log,
    save_model,
    write_json,
)
from far.llm.loader import MODEL_ALIASES, load_causal_lm
from far.llm.memory import page_out_after_forward, release_freed_memory
from far.llm.priming import prime_and_reconfigure
from far.llm.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    PromptTemplate,
    accuracy,
    encode_prompts,
    label_word_ids,
    predict,
    prompt_loss_fn,
)

logger = logging.getLogger("far.cli")

PROMPT_TEMPLATES: dict[str, PromptTemplate] = {"sst2": SST2_TEMPLATE}
# SmolLM2-135M on SST-2 prompts (experiments/llm_sst2.py): MeZO + FAR trained well at lr 3e-4 in 80 steps,
# where MeZO on every weight diverged; 1e-4 is the safe default for both.
PROMPT_DEFAULTS = {
    "adamw": dict(lr=1e-5, epochs=1.0, max_steps=None, batch_size=16, max_length=128, warmup=0.0),
    "mezo": dict(lr=1e-4, epochs=None, max_steps=1000, batch_size=16, max_length=128, warmup=0.0),
}
PRIMING_MICRO_BATCH = 4
MAX_PRIMING_BATCHES = 16
PREDICTIONS_FILE = "predictions.tsv"


def is_prompted_model(name_or_path: str) -> bool:
    """Whether `far glue` trains this model by prompts: a far.llm alias or a `.gguf` file."""
    return name_or_path in MODEL_ALIASES or os.fspath(name_or_path).endswith(".gguf")


def priming_batches(priming: float | int, max_steps: int) -> int:
    """Gradient-priming batches for `--priming`: a number as given, a fraction of the steps capped at 16."""
    if isinstance(priming, int):
        return priming
    return min(MAX_PRIMING_BATCHES, max(1, round(priming * max_steps))) if priming > 0 else 0


def run_prompted(args: argparse.Namespace, task) -> int:
    """`far glue` for a causal LM; `task` is a `far.data.glue.GlueTask`."""
    from far.data.glue import load_glue

    template = PROMPT_TEMPLATES.get(task.name)
    if template is None:
        raise UsageError(
            f"--model {args.model} is a causal LM, trained by prompts; there is a prompt for "
            f"{', '.join(PROMPT_TEMPLATES)} only, not {task.name}. Use an encoder model for {task.name}"
        )
    hparams = resolve_hyperparameters(args, PROMPT_DEFAULTS)
    require_finetune()
    release_freed_memory()
    out = output_dir(args, f"{task.name}-{args.method}")
    splits = load_glue(task.name, args.data_dir)
    train_raw = first(splits["train"], args.max_train_samples)
    dev_raw = first(splits["validation"], args.max_eval_samples)
    try:
        model, tokenizer = load_causal_lm(args.model)
    except ModuleNotFoundError as e:
        raise UsageError(str(e)) from None
    label_ids = label_word_ids(tokenizer, template)
    text = task.text_columns[0]
    train = encode_prompts(tokenizer, train_raw[text], train_raw["label"], template, hparams["max_length"])
    dev = encode_prompts(tokenizer, dev_raw[text], dev_raw["label"], template, hparams["max_length"])
    pad = tokenizer.pad_token_id
    collate, loss_fn = PromptCollator(pad), prompt_loss_fn(label_ids)
    dev_idx, dev_labels = list(dev_raw["idx"]), list(dev_raw["label"])
    del splits, train_raw, dev_raw  # encoded: give the raw tables back before the model's pages are read
    if args.no_save_model:
        tokenizer = None  # only saving needs it again
    gc.collect()
    release_freed_memory()

    def evaluate(m):
        return {"accuracy": accuracy(m, dev, label_ids, pad, batch_size=args.eval_batch_size)}

    kwargs = finetune_kwargs(args, hparams)
    selection = kwargs.pop("selection", None)
    retention = kwargs.pop("retention")
    for key in ("freeze_ffn", "priming", "freeze_embeddings"):
        kwargs.pop(key, None)
    with run_log(out):
        logger.info(
            "far glue: %s by prompts, model %s, method %s, optimizer %s, %d training examples, %s",
            task.name,
            args.model,
            args.method,
            args.optimizer,
            len(train),
            dict(hparams),
        )
        extra = {}
        if selection is not None:  # far / random: gradient priming (not for random), surgery
            page_out_after_forward(model.get_input_embeddings())  # frozen below: keep only rows in use
            steps = hparams["max_steps"] or math.ceil(hparams["epochs"] * len(train) / hparams["batch_size"])
            n = priming_batches(args.priming, steps) if selection != "random" else 0
            examples = [train[i] for i in range(min(len(train), n * hparams["batch_size"]))]
            batches = [
                collate(examples[i : i + PRIMING_MICRO_BATCH]) for i in range(0, len(examples), PRIMING_MICRO_BATCH)
            ]
            if selection != "random" and not batches:
                raise UsageError("--priming must give at least one gradient-priming batch for --method far")
            prime_and_reconfigure(model, batches, loss_fn, retention, selection=selection, seed=args.seed)
            extra["gradient_priming_examples"] = len(examples)
        elif args.method == "freeze-ffn":
            far.freeze_ffns(model)
        result = far.finetune(
            model,
            train,
            retention=None,
            collate_fn=collate,
            loss_fn=loss_fn,
            eval_fn=evaluate,
            output_dir=out,
            **kwargs,
        )
        metrics = dict(result.metrics or {}) or evaluate(model)
        logger.info("%s (%s, prompts): %s", task.name, args.method, metrics)
    predictions = predict(model, dev, label_ids, pad, batch_size=args.eval_batch_size)
    write_predictions(out / PREDICTIONS_FILE, dev_idx, predictions.tolist(), dev_labels, task.label_names)
    files = {"log": "train.log", "predictions": PREDICTIONS_FILE}
    if not args.no_save_model:
        model_dir = Path(args.model_dir) if args.model_dir else out / "model"
        if save_model(model, tokenizer, model_dir) is not None:
            files["model"] = str(model_dir)
    record = {
        "task": task.name,
        "method": args.method,
        "retention": retention,
        "selection": selection,
        "optimizer": args.optimizer,
        "model": args.model,
        "prompt": template.template,
        "label_words": list(template.label_words),
        "freeze_embeddings": selection is not None,
        **result.to_dict(),
        "metrics": metrics,
        "hyperparameters": dict(hparams),
        **extra,
        "train_examples": len(train),
        "eval_examples": len(dev),
        "files": files,
        "far_version": far.__version__,
    }
    write_json(out / METRICS_FILE, record)
    print_metrics(f"{task.name} ({args.method}, prompts)", metrics)
    print(f"wrote {out / METRICS_FILE}, predictions and the training log to {out}")
    return 0


def write_predictions(path: Path, idx, predictions, labels, names) -> None:
    """TSV `index  prediction  label` with class names, like the encoder path's predictions file."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "prediction", "label"])
        for i, prediction, label in zip(idx, predictions, labels, strict=True):
            writer.writerow([i, names[prediction], names[label]])
