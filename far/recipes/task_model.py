"""What every encoder run builds the same way: the model with its task head and method, and the record's split.

Light to import (transformers' model code is imported by the loader, when a model is loaded), so that
the user's-files run and the GLUE/SQuAD runs share it without the one importing what the other needs.
"""

from __future__ import annotations

from torch import nn
from transformers import DataCollatorWithPadding

from far.models import check_max_length, load_model_and_tokenizer
from far.recipes.report import TrainingRun
from far.recipes.settings import RunSettings
from far.saving.shared_layout import check_layout

# The model config's record of the columns it was trained on, so that `far predict` reads the same ones.
COLUMNS_KEY = "far_columns"


def task_model(
    settings: RunSettings, max_length: int, *head: object, config: dict | None = None, **options: object
) -> tuple[nn.Module, object, dict]:
    """The run's model with its task head, the method applied (e.g. LoRA's wrapper), its tokenizer, and the
    method's record; `config` entries are written into the model's config before the method wraps it.

    Everything a user can get wrong with the model (a name, a head, a length) fails here, before training.
    """
    model, tokenizer = load_model_and_tokenizer(
        settings.model, *head, seed=settings.seed, runtime=settings.encoder_runtime, **options
    )
    check_max_length(model, max_length)
    if settings.shared_layout is not None:  # a layout for another base or shape: refused before anything is written
        check_layout(model, settings.shared_layout)
    for key, value in (config or {}).items():
        setattr(model.config, key, value)
    model, record = settings.method_spec.apply(model, base_model=settings.model, lora=settings.lora_settings())
    return model, tokenizer, record


def held_out(settings: RunSettings) -> dict:
    # The record says when the metric is on held-out training rows rather than the validation split.
    if settings.validation_from_train is None:
        return {}
    return {"validation_from_train": settings.validation_from_train}


def task_run(
    settings: RunSettings,
    task: str,
    loaded: tuple[nn.Module, object, dict],
    train_data: object,
    evaluator: object,
    hparams: dict,
    **extra: object,
) -> TrainingRun:
    """The `TrainingRun` of a `task_model` (`loaded`), batches padded by its tokenizer; `extra` goes on the record
    with the held-out split and the method's record."""
    model, tokenizer, method_record = loaded
    return TrainingRun(
        task=task,
        settings=settings,
        model=model,
        tokenizer=tokenizer,
        train_data=train_data,
        collate_fn=DataCollatorWithPadding(tokenizer),
        evaluator=evaluator,
        hyperparameters=hparams,
        extra={**extra, **held_out(settings), **method_record},
    )
