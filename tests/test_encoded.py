"""`far.data.encoded`: packed tokenised examples, the same as `tokenize_texts` gives through `datasets`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, DataCollatorWithPadding

from far.data.encoded import EncodedExamples, encode_texts
from far.data.files import LabelSpace, as_dataset, tokenize_texts
from far.data.table import Table

TEXTS = ["A warm, funny film.", "He said dull twice.", "Lovely.", "a " * 200, "Ends well?"]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.mark.parametrize("columns", [("a",), ("a", "b")])
def test_encode_texts_matches_tokenize_texts(tokenizer, columns):
    table = Table({"a": TEXTS, "b": TEXTS[::-1], "label": [1, 0, 1, 0, 1]})
    ours = encode_texts(table, tokenizer, columns, max_length=16)
    theirs = tokenize_texts(as_dataset(table, LabelSpace(("neg", "pos"))), tokenizer, columns, max_length=16)
    assert len(ours) == len(theirs)
    for i in range(len(ours)):
        assert ours[i] == {k: theirs[i][k] for k in ours[i]}
        assert set(ours[i]) == set(theirs[i])
    assert ours.lengths() == [len(e["input_ids"]) for e in theirs]
    collate = DataCollatorWithPadding(tokenizer)
    torch.testing.assert_close(collate([ours[0], ours[3]]), collate([theirs[0], theirs[3]]))


def test_examples_without_labels_and_indexing(tokenizer):
    examples = encode_texts(Table({"text": TEXTS[:2]}), tokenizer, ("text",))
    assert "labels" not in examples[0] and examples[-1] == examples[1]
    with pytest.raises(IndexError):
        examples[2]
    with pytest.raises(ValueError, match="at least 8 tokens"):
        encode_texts(Table({"text": TEXTS}), tokenizer, ("text",), max_length=4)


def test_inconsistent_packing_is_refused():
    with pytest.raises(ValueError, match="offsets"):
        EncodedExamples(torch.zeros(5, dtype=torch.int32), None, torch.tensor([0, 3]), None)
    with pytest.raises(ValueError, match="labels"):
        EncodedExamples(torch.zeros(3, dtype=torch.int32), None, torch.tensor([0, 3]), [1, 0])
