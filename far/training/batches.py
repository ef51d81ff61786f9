"""Batches of a map-style dataset in a seeded order that a resumed run can pick up mid-epoch.

With `group_by_length`, each epoch's shuffled order is cut into groups of `GROUP_BATCHES` batches,
each group sorted by length and cut into batches, and the batches shuffled: a batch then pads to the
longest of similar examples (SST-2's training sentences: 3.1x their tokens in random batches of 32,
1.07x grouped). Every example is still seen once an epoch, and each step's batch is, over the random
order, a uniform draw of the training set: the update is the same in expectation (Hugging Face's
`group_by_length` does the same).

A batch may be cut into micro-batches (at most so many examples, or so many padded tokens) that a
step accumulates, each weighted by its share of the step's examples: the same mean loss, hence the
same update, as the whole batch, in the memory of its largest micro-batch (`far.training.budget`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from far.seeds import derive_seed

# Batches per group that `group_by_length` sorts: large enough that a group's lengths cover the split's spread.
GROUP_BATCHES = 50


class MicroBatch(NamedTuple):
    """A collated piece of a batch, how many examples it holds, their indices in the dataset, and the examples of
    the whole batch it is part of (over every process of a data-parallel run; 0: this piece's batch alone)."""

    batch: Any
    examples: int
    indices: tuple[int, ...] = ()
    whole: int = 0


def example_length(example: Any) -> int | None:
    """Tokens of a tokenised example (`len(example["input_ids"])`); None for another kind of example."""
    if isinstance(example, Mapping) and "input_ids" in example:
        return len(example["input_ids"])
    return None


def longest_example(dataset: Sequence[Any], default: int) -> int:
    """The most tokens of an example of `dataset` (its `lengths()` where it has them, else each example's
    `input_ids`), at most `default`; `default` where the examples' lengths cannot be read."""
    lengths = dataset.lengths() if callable(getattr(dataset, "lengths", None)) else None
    if lengths is None:
        lengths = [example_length(dataset[i]) for i in range(len(dataset))]
    if not lengths or any(length is None for length in lengths):
        return default
    return min(default, max(lengths))


def split_batch(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Positions of a batch's examples grouped into micro-batches of at most `max_tokens` tokens once padded
    to their longest (one example at least, however long), longest first so that each pads little.

    Example:
        >>> split_batch([5, 30, 10, 12], max_tokens=40)
        [[1], [3, 2, 0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: equal lengths keep their order
    groups: list[list[int]] = []
    for i in order:
        # Longest first: a group's first example sets its padded length.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class BatchStream:
    """Batches of `dataset`, reshuffled each epoch from `seed`, as one endless numbered stream.

    Batch *i* is always the same examples, so a run resumed at step *s* continues with batch
    `s * grad_accum` without replaying the ones before it. The last batch of an epoch may be smaller.
    Each batch comes as a list of `MicroBatch`es: the whole batch, or with `micro_tokens` the pieces of
    it that `split_batch` makes.

    Args:
        dataset: A map-style dataset: `len(dataset)` and `dataset[i]` (a list, a torch `Dataset`,
            a `datasets.Dataset`).
        batch_size: Examples per batch.
        collate_fn: Turns a list of examples into a batch (e.g. `transformers.default_data_collator`).
        seed: Seed of the shuffling.
        micro_tokens: The most padded tokens of one micro-batch; an example whose length it cannot read
            (no `input_ids`) counts as `max_length` tokens.
        max_length: The longest an example can be.
        group_by_length: Batch examples of similar lengths together (above).
    """

    def __init__(
        self,
        dataset: Sequence[Any],
        batch_size: int,
        collate_fn: Callable[[list], Any],
        seed: int,
        *,
        micro_tokens: int | None = None,
        max_length: int = 128,
        group_by_length: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.seed = seed
        self.micro_tokens, self.max_length = micro_tokens, max_length
        self.batches_per_epoch = math.ceil(len(dataset) / batch_size)
        self.group_by_length = group_by_length
        self._lengths: list[int] | None = None

    def lengths(self) -> list[int]:
        """Each example's tokens (`max_length` where they cannot be read), read once."""
        if self._lengths is None:
            found = self.dataset.lengths() if callable(getattr(self.dataset, "lengths", None)) else None
            if found is None and hasattr(self.dataset, "column_names") and "input_ids" in self.dataset.column_names:
                found = [len(ids) for ids in self.dataset["input_ids"]]
            if found is None:
                found = [example_length(self.dataset[i]) for i in range(len(self.dataset))]
            self._lengths = [self.max_length if n is None else n for n in found]
        return self._lengths

    def order(self, epoch: int) -> Tensor:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        order = torch.randperm(len(self.dataset), generator=generator)
        if not self.group_by_length:
            return order
        lengths, size = self.lengths(), self.batch_size
        groups = []
        for group in order.split(size * GROUP_BATCHES):  # longest first within a group; ties keep the random order
            groups.append(group[sorted(range(len(group)), key=lambda i: -lengths[group[i]])])
        batches = list(torch.cat(groups).split(size))
        # Only the epoch's last batch may be short: it stays last, so every batch before it is whole.
        whole, short = (batches[:-1], batches[-1:]) if len(order) % size else (batches, [])
        shuffled = [whole[i] for i in torch.randperm(len(whole), generator=generator).tolist()]
        return torch.cat(shuffled + short) if shuffled or short else order

    def padded_tokens(self, start: int, count: int) -> list[int]:
        """Each of batches `start` .. `start + count - 1`'s examples times its longest: what its work grows with."""
        lengths, size, tokens = self.lengths(), self.batch_size, []
        epoch, offset = divmod(start, self.batches_per_epoch)
        while len(tokens) < count:
            order = self.order(epoch).tolist()
            for b in range(offset, min(self.batches_per_epoch, offset + count - len(tokens))):
                idx = order[b * size : (b + 1) * size]
                tokens.append(len(idx) * max(lengths[i] for i in idx))
            epoch, offset = epoch + 1, 0
        return tokens

    def batches(
        self, start: int = 0, share: Callable[[list[int]], list[int]] | None = None
    ) -> Iterator[list[MicroBatch]]:
        """Batches number `start`, `start + 1`, ... forever, each as its micro-batches.

        Args:
            share: This process's share of a batch's indices in a data-parallel run (`far.training.distributed`);
                each `MicroBatch.whole` then counts the whole batch. A process whose share is empty gets the
                batch's first example as a piece of 0 examples, so that it still takes part in the step.
        """
        epoch, offset = divmod(start, self.batches_per_epoch)
        while True:
            order = self.order(epoch)
            for b in range(offset, self.batches_per_epoch):
                idx = order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
                whole = len(idx)
                if share is not None:
                    mine = share(idx)
                    if not mine:  # (weight 0: its gradient adds nothing)
                        yield [MicroBatch(self.collate_fn([self.dataset[idx[0]]]), 0, (idx[0],), whole)]
                        continue
                    idx = mine
                examples = [self.dataset[i] for i in idx]
                if self.micro_tokens is None:
                    yield [MicroBatch(self.collate_fn(examples), len(examples), tuple(idx), whole)]
                    continue
                lengths = [example_length(e) or self.max_length for e in examples]
                groups = split_batch(lengths, self.micro_tokens)
                yield [
                    MicroBatch(
                        self.collate_fn([examples[i] for i in group]), len(group), tuple(idx[i] for i in group), whole
                    )
                    for group in groups
                ]
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
