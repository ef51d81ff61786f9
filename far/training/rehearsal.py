"""How long a run's steps will take, said before the first: a piece of the first step's work, timed and undone.

A run times the forward and backward of its first step's first micro-batch (a zeroth-order run: the forward
passes of one) with torch's random state put back afterwards and the gradients dropped, so the run goes on as if
it had not happened: the same dropout masks, the same updates. The piece's seconds then cost the steps left, each
in proportion to its padded tokens where batches are grouped by length (a grouped run's first batch may be its
shortest or its longest), else as many pieces as the first step has.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from far.training.batches import BatchStream, MicroBatch


def timed(work: Callable[[], Any], device: torch.device, *, grad: bool = True) -> float:
    """Seconds `work()` takes (`grad=False`: with no autograd graph), with torch's random state (CPU's, and
    `device`'s on CUDA) as it was before it."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began


def collated_tokens(batch: Any) -> int | None:
    """Tokens a collated batch computes on (its `input_ids`' elements); None for another kind of batch."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return ids.numel() if isinstance(ids, Tensor) else None


def steps_seconds(
    piece_seconds: float, step: Sequence[Sequence[MicroBatch]], left: int, stream: BatchStream, first_batch: int
) -> float:
    """The `left` steps' seconds from the timed piece's, the first micro-batch of `step` (the first step's
    batches, each as its micro-batches), whose batches are `stream`'s from number `first_batch` on."""
    tokens = collated_tokens(step[0][0].batch)
    if stream.group_by_length and tokens:
        return piece_seconds * sum(stream.padded_tokens(first_batch, left * len(step))) / tokens
    return piece_seconds * sum(map(len, step)) * left
