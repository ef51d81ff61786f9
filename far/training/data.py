"""Batches of a map-style dataset in a seeded order that a resumed run can pick up mid-epoch."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from far.seeds import derive_seed


class BatchStream:
    """Batches of `dataset`, reshuffled each epoch from `seed`, as one endless numbered stream.

    Batch *i* is always the same examples, so a run resumed at step *s* continues with batch
    `s * grad_accum` without replaying the ones before it. The last batch of an epoch may be smaller.

    Args:
        dataset: A map-style dataset: `len(dataset)` and `dataset[i]` (a list, a torch `Dataset`,
            a `datasets.Dataset`).
        batch_size: Examples per batch.
        collate_fn: Turns a list of examples into a batch (e.g. `transformers.default_data_collator`).
        seed: Seed of the shuffling.
    """

    def __init__(self, dataset: Sequence[Any], batch_size: int, collate_fn: Callable[[list], Any], seed: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.seed = seed
        self.batches_per_epoch = math.ceil(len(dataset) / batch_size)

    def order(self, epoch: int) -> Tensor:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(len(self.dataset), generator=generator)

    def batches(self, start: int = 0) -> Iterator[Any]:
        """Batches number `start`, `start + 1`, ... forever."""
        epoch, offset = divmod(start, self.batches_per_epoch)
        while True:
            order = self.order(epoch)
            for b in range(offset, self.batches_per_epoch):
                idx = order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
                yield self.collate_fn([self.dataset[i] for i in idx])
            epoch, offset = epoch + 1, 0


def to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors of a batch (a tensor, or a mapping / list / tuple of them) to `device`."""
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):  # also transformers' BatchEncoding; a plain dict comes back
        return {k: to_device(v, device) for k, v in batch.items()}
    if type(batch) in (list, tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
