"""Tokenised examples packed into flat arrays: what `tokenize_texts` makes, without `datasets`.

A list of per-example dicts of Python ints costs about 50 bytes a token; `EncodedExamples` keeps the
token ids of every example in one int32 tensor (4 bytes a token) and builds an example's dict only
when it is asked for, as a batch is collated. A run under a memory budget tokenises its files so.

    >>> examples = encode_texts(table, tokenizer, ("sentence1", "sentence2"), max_length=128)
    >>> DataCollatorWithPadding(tokenizer)([examples[0], examples[1]])["input_ids"].shape
    torch.Size([2, 41])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from far.data.table import Table

CHUNK = 1024  # texts tokenised per call: the fast tokenizer's batching, in bounded memory


class EncodedExamples:
    """Tokenised examples (`input_ids`, `token_type_ids` where the tokenizer makes them, an all-ones
    `attention_mask`) and their `labels`, packed; `examples[i]` is example i as a dict of lists.

    Args:
        ids: Every example's token ids, one after the other: (total tokens,) int32.
        type_ids: The same for token types, or None.
        offsets: Where each example starts in `ids`, and the end: (n + 1,) int64.
        labels: One label per example (class id or value), or None.
    """

    def __init__(self, ids: torch.Tensor, type_ids: torch.Tensor | None, offsets: torch.Tensor, labels: list | None):
        if offsets.numel() < 1 or int(offsets[-1]) != ids.numel():
            raise ValueError("offsets must start every example in ids and end at its length")
        if labels is not None and len(labels) != offsets.numel() - 1:
            raise ValueError(f"got {len(labels)} labels for {offsets.numel() - 1} examples")
        self.ids, self.type_ids, self.offsets, self.labels = ids, type_ids, offsets, labels

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} of {len(self)}")
        i %= len(self)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        example = {"input_ids": self.ids[start:end].tolist(), "attention_mask": [1] * (end - start)}
        if self.type_ids is not None:
            example["token_type_ids"] = self.type_ids[start:end].tolist()
        if self.labels is not None:
            example["labels"] = self.labels[i]
        return example

    def lengths(self) -> list[int]:
        return (self.offsets[1:] - self.offsets[:-1]).tolist()


def encode_texts(table: Table, tokenizer, text_columns: Sequence[str], max_length: int = 128) -> EncodedExamples:
    """`table`'s texts (one column, or a pair) tokenised and truncated to `max_length` tokens, not padded;
    its `label` column, when it has one, as the `labels`. The same encoding as `far.data.files.tokenize_texts`.
    """
    if max_length < 8:
        raise ValueError(f"max_length must be at least 8 tokens, got {max_length}")
    ids, type_ids, lengths = [], [], []
    for start in range(0, len(table), CHUNK):
        texts = [table[c][start : start + CHUNK] for c in text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        for row, example_ids in enumerate(encoded["input_ids"]):
            ids.append(torch.tensor(example_ids, dtype=torch.int32))
            if "token_type_ids" in encoded:
                type_ids.append(torch.tensor(encoded["token_type_ids"][row], dtype=torch.int8))
            lengths.append(len(example_ids))
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    labels = list(table["label"]) if "label" in table.column_names else None
    flat_types = torch.cat(type_ids) if type_ids else None
    return EncodedExamples(torch.cat(ids) if ids else torch.empty(0, dtype=torch.int32), flat_types, offsets, labels)
