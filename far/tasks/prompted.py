"""GLUE by prompts with a causal LM (`smollm2-135m`, a `.gguf` file): a run that fits about inference memory.

The task becomes a prompt and one label word per class (SST-2: `<sentence> It was` + ` great` /
` terrible`), scored from the LM's logits of the label words at the prompt's end, as in MeZO
(`far.tasks.prompts`). The run keeps to the memory of inference: weights stay memory-mapped where
they are only read, the frozen embedding keeps only the rows in use resident, and FAR's priming
is gradient priming (`far.llm.priming`) rather than AdamW steps. So with a causal LM,
`far`/`random` always freeze the embeddings (the tied LM head with them: 21% of SmolLM2's
weights), and the priming length counts gradient-priming batches (a fraction of the steps, at
most 16 batches, or a number), each run in micro-batches of 4.
"""

from __future__ import annotations

import dataclasses
import gc
import math

from torch import nn

from far.llm.memory import page_out_after_forward, release_freed_memory
from far.llm.priming import prime_and_reconfigure
from far.surgery import freeze_ffns
from far.tasks.evaluators import PromptEvaluator
from far.tasks.glue import GLUE_TASKS, load_glue
from far.tasks.models import load_causal_lm
from far.tasks.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    PromptTemplate,
    encode_prompts,
    label_word_ids,
    prompt_loss_fn,
)
from far.tasks.report import TrainingRun
from far.tasks.settings import PROMPT_DEFAULTS, RunSettings, first
from far.training.plan import steps_of

PROMPT_TEMPLATES: dict[str, PromptTemplate] = {"sst2": SST2_TEMPLATE}
PRIMING_MICRO_BATCH = 4
MAX_PRIMING_BATCHES = 16


def priming_batches(priming: float | int, max_steps: int) -> int:
    """Gradient-priming batches for a priming length: a number as given, a fraction of the steps capped at 16."""
    if isinstance(priming, int):
        return priming
    return min(MAX_PRIMING_BATCHES, steps_of(priming, max_steps, "priming"))


def prompted_run(settings: RunSettings, task_name: str) -> TrainingRun:
    """A GLUE task's run with a causal LM, trained by prompts (`far glue --model smollm2-135m`)."""
    task = GLUE_TASKS[task_name]
    template = PROMPT_TEMPLATES.get(task.name)
    if template is None:
        raise ValueError(
            f"--model {settings.model} is a causal LM, trained by prompts; there is a prompt for "
            f"{', '.join(PROMPT_TEMPLATES)} only, not {task.name}. Use an encoder model for {task.name}"
        )
    if settings.method_spec.lora or settings.validation_from_train is not None:
        raise ValueError(
            "a causal LM trained by prompts takes --method full, far, random or freeze-ffn and the dev split; "
            "--method lora and --validation-from-train are for encoder models (far glue, far squad, far train)"
        )
    hparams = settings.hyperparameters(PROMPT_DEFAULTS)
    release_freed_memory()
    splits = load_glue(task.name, settings.data_dir)
    train_raw = first(splits["train"], settings.max_train_samples)
    dev_raw = first(splits["validation"], settings.max_eval_samples)
    try:
        model, tokenizer = load_causal_lm(settings.model)
    except ModuleNotFoundError as e:  # the alias's package: a usage error, with the pip command
        raise ValueError(str(e)) from None
    label_ids = label_word_ids(tokenizer, template)
    text = task.text_columns[0]
    train = encode_prompts(tokenizer, train_raw[text], train_raw["label"], template, hparams["max_length"])
    dev = encode_prompts(tokenizer, dev_raw[text], dev_raw["label"], template, hparams["max_length"])
    evaluator = PromptEvaluator(
        dev,
        label_ids,
        tokenizer.pad_token_id,
        idx=dev_raw["idx"],
        names=task.label_names,
        batch_size=settings.eval_batch_size,
    )
    collate, loss_fn = PromptCollator(tokenizer.pad_token_id), prompt_loss_fn(label_ids)
    del splits, train_raw, dev_raw  # encoded: give the raw tables back before the model's pages are read
    gc.collect()
    release_freed_memory()
    # The surgery (if any) happens in `prepare`, so far.finetune trains the model as it finds it.
    options = settings.finetune_options(hparams)
    for key in ("freeze_ffn", "priming", "freeze_embeddings", "selection", "attention_retention"):
        options.pop(key, None)
    options["retention"] = None
    far_config = settings.far_config()
    if far_config is not None:
        far_config = dataclasses.replace(far_config, freeze_embeddings=True)

    def prepare(model: nn.Module) -> dict:
        if far_config is None:
            if settings.method_spec.freeze_ffn:
                freeze_ffns(model)
            return {"freeze_embeddings": False}
        page_out_after_forward(model.get_input_embeddings())  # frozen below: keep only rows in use
        steps = hparams["max_steps"] or math.ceil(hparams["epochs"] * len(train) / hparams["batch_size"])
        n = priming_batches(settings.priming, steps) if far_config.selection != "random" else 0
        examples = [train[i] for i in range(min(len(train), n * hparams["batch_size"]))]
        batches = [collate(examples[i : i + PRIMING_MICRO_BATCH]) for i in range(0, len(examples), PRIMING_MICRO_BATCH)]
        if far_config.selection != "random" and not batches:
            raise ValueError("--priming must give at least one gradient-priming batch for --method far")
        prime_and_reconfigure(model, batches, loss_fn, far_config)
        return {"freeze_embeddings": True, "gradient_priming_examples": len(examples)}

    return TrainingRun(
        task=task.name,
        settings=settings,
        model=model,
        tokenizer=tokenizer if settings.save_model else None,
        train_data=train,
        collate_fn=collate,
        loss_fn=loss_fn,
        evaluator=evaluator,
        hyperparameters=hparams,
        options=options,
        prepare=prepare,
        extra={
            "prompt": template.template,
            "label_words": list(template.label_words),
            "train_examples": len(train),
            "eval_examples": len(dev),
        },
        label="prompts",
    )
