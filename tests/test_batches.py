"""Batches in a seeded order: every example once an epoch, and with `group_by_length`, batches of similar lengths."""

from __future__ import annotations

import itertools

import pytest
import torch

from far.seeds import derive_seed
from far.training.batches import GROUP_BATCHES, BatchStream


def examples(n: int, seed: int = 0) -> list[dict]:
    lengths = torch.randint(2, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [{"input_ids": list(range(k)), "labels": i} for i, k in enumerate(lengths)]


def epoch_batches(stream: BatchStream, start: int = 0) -> list[list[int]]:
    batches = itertools.islice(stream.batches(start), stream.batches_per_epoch - start % stream.batches_per_epoch)
    return [list(micro.indices) for batch in batches for micro in batch]


def padded(data: list[dict], batches: list[list[int]]) -> int:
    return sum(len(b) * max(len(data[i]["input_ids"]) for i in b) for b in batches)


@pytest.mark.parametrize("n", [3 * 32 * GROUP_BATCHES // 2 + 7, 640])  # a short last batch, and none
def test_grouped_batches_see_every_example_once_an_epoch_with_little_padding(n):
    data = examples(n)
    plain = BatchStream(data, 32, list, seed=1)
    grouped = BatchStream(data, 32, list, seed=1, group_by_length=True)
    for epoch_start in (0, grouped.batches_per_epoch):  # two epochs: each a permutation of the examples
        batches = epoch_batches(grouped, epoch_start)
        assert sorted(i for b in batches for i in b) == list(range(n))
        assert all(len(b) == 32 for b in batches[:-1]) and len(batches[-1]) == n - 32 * (len(batches) - 1)
    assert padded(data, epoch_batches(grouped)) < 0.6 * padded(data, epoch_batches(plain))
    # Seeded: a stream resumed mid-epoch goes on with the same batches, and other epochs differ.
    again = BatchStream(data, 32, list, seed=1, group_by_length=True)
    assert epoch_batches(again, 5) == epoch_batches(grouped)[5:]
    assert epoch_batches(grouped) != epoch_batches(grouped, grouped.batches_per_epoch)
    # The batches' order is shuffled, not longest first.
    longest = [max(len(data[i]["input_ids"]) for i in b) for b in epoch_batches(grouped)]
    assert longest != sorted(longest, reverse=True)


def test_grouping_reads_lengths_from_a_dataset_column_and_leaves_plain_order_alone():
    datasets = pytest.importorskip("datasets")
    data = examples(100)
    table = datasets.Dataset.from_list(data)
    assert BatchStream(table, 8, list, seed=0, group_by_length=True).lengths() == [len(d["input_ids"]) for d in data]
    plain = BatchStream(data, 8, list, seed=0)
    generator = torch.Generator().manual_seed(derive_seed(0, 0))
    assert plain.order(0).tolist() == torch.randperm(100, generator=generator).tolist()  # as before grouping existed
