"""`prime_layout`: FAR's priming phase alone, and what it chose written as a layout to share (`far prime`).

Users of one base and one task can share the layout priming chooses: one run primes and writes it, every
other run trains with it from step 0 (`far.finetune(..., layout=path)`), with no priming step of its own.
The priming here is the first `priming` steps of the very run `far.finetune` would make with the same data
and options (the same schedule, batches and seed), so a run trained with the layout starts from the learners
that run would have chosen at its switch.

    >>> prime_layout(model, user_a_examples, "layout.safetensors", epochs=3, lr=1e-4)
    >>> far.finetune(base_for_user_b, user_b_examples, layout="layout.safetensors", epochs=3, lr=1e-4)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from far.architectures import FFNSpec
from far.config import FARConfig
from far.saving.shared_layout import (
    SharedLayout,
    backbone_fingerprint,
    check_layout_output,
    read_shared_layout,
    write_shared_layout,
)
from far.training.finetune import finetune
from far.training.options import TrainOptions


def prime_layout(
    model: nn.Module,
    train_data: Any,
    path: str | os.PathLike,
    config: FARConfig | str = "auto",
    *,
    options: TrainOptions | None = None,
    record: Mapping[str, object] | None = None,
    overwrite: bool = False,
    spec: FFNSpec | None = None,
    **keywords: Any,
) -> SharedLayout:
    """Prime `model` on `train_data` as `far.finetune` would, and write what priming chose to `path`.

    Args:
        model: The plain base with its task head; it ends reconfigured with the chosen learners, trained
            by the priming steps only.
        train_data: The examples priming steps over (a map-style dataset, as `far.finetune` takes).
        path: The layout file to write (`far.saving.shared_layout`), atomically.
        config: The surgery whose learners priming chooses: "auto" (FAR's automatic configuration,
            the default), "paper", or a `far.FARConfig` that reads priming scores. Left out with `options`.
        options: The run's `far.training.TrainOptions` instead of keywords (its config included).
        record: What the layout keeps of how it was primed (task, model, ...), besides the steps.
        overwrite: Replace an existing file at `path`; without it the call is refused before anything runs.
        spec: FFN layout for architectures that are not built in.
        **keywords: `far.finetune`'s options (epochs, lr, batch_size, priming, seed, ...): give those of the
            runs that will train with the layout, since the priming steps follow their schedule.

    Returns:
        The layout as written (`SharedLayout`: its learners, config and digest).
    """
    path = check_layout_output(path, overwrite)
    fingerprint = backbone_fingerprint(model, spec)  # of the base, before priming moves it
    if options is not None:
        run = dataclasses.replace(options, stop_after_priming=True)
        result = finetune(model, train_data, options=run, spec=spec, **keywords)
    else:
        result = finetune(model, train_data, config, stop_after_priming=True, spec=spec, **keywords)
    steps = {"priming_steps": result.priming_steps, "total_steps": result.steps}
    seconds = {"priming_seconds": round(result.priming_seconds, 3)}
    record = {**(record or {}), **steps, **seconds}
    write_shared_layout(path, model, base_fingerprint=fingerprint, record=record, spec=spec)
    return read_shared_layout(path)
