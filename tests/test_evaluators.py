"""Evaluating labelled examples: batched by length, the predictions in the split's order, as one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from far.evaluation.labels import LabelEvaluator, TextMetric


def pad(rows: list[dict]) -> dict:
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("num_labels", [1, 3])
def test_length_sorted_batches_predict_in_the_splits_order_as_one_example_at_a_time(num_labels):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        num_labels=num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config)
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, size=23)  # unsorted, with ties
    rows = [{"input_ids": rng.integers(1, 50, size=n).tolist(), "labels": i % 3} for i, n in enumerate(lengths)]
    names = () if num_labels == 1 else ("a", "b", "c")
    metric = TextMetric("regression" if num_labels == 1 else "classification")
    batched = LabelEvaluator(rows, pad, label_names=names, metric=metric, batch_size=4)
    alone = LabelEvaluator(rows, pad, label_names=names, metric=metric, batch_size=1)
    scores = batched(model)
    assert scores == pytest.approx(alone(model), abs=1e-6)
    if num_labels == 1:
        np.testing.assert_allclose(batched.predictions, alone.predictions, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(batched.predictions, alone.predictions)
    assert model.training  # put back in the mode it was found in
