"""`far prime`'s recipe: a task's run primed only, and what priming chose written as a layout to share.

>>> layout = prime_and_write(glue_run(settings, "sst2", check_output=False), "layout.safetensors")
"""

from __future__ import annotations

import os

import far
from far.models import resolve_model
from far.recipes.configuration import configuration_record
from far.recipes.report import TrainingRun
from far.saving.layout_file import SharedLayout
from far.saving.stock import stock_reader
from far.training.prime import prime_layout


def prime_and_write(run: TrainingRun, path: str | os.PathLike, *, overwrite: bool = False) -> SharedLayout:
    """Run the priming phase of `run` (the steps `train_and_report(run)` would prime with) and write the layout it
    chose to `path`, with what primed it: the task, the model, the configuration, the hyper-parameters."""
    settings = run.settings
    record = {
        "task": run.task,
        "model": settings.model,
        "configuration": configuration_record(settings, None),
        "hyperparameters": run.hyperparameters,
        "seed": settings.seed,
        "train_examples": len(run.train_data),
        "far_version": far.__version__,
    }
    return prime_layout(
        run.model,
        run.train_data,
        path,
        options=settings.train_options(run.hyperparameters),
        record=record,
        overwrite=overwrite,
        collate_fn=run.collate_fn,
        loss_fn=run.loss_fn,
        # Priming reads the stock FFNs back from the model's file instead of keeping a copy of them.
        base_weights=stock_reader(resolve_model(settings.model), run.model),
    )
