"""The real embedded MiniLM (all-MiniLM-L6-v2) with a sequence-classification head."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import far

pytestmark = pytest.mark.slow  # whole processes, real models or notebooks


def test_real_minilm_logits_unchanged_by_surgery_and_restore(minilm_path):
    torch.manual_seed(0)  # the new classifier head
    model = AutoModelForSequenceClassification.from_pretrained(minilm_path, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    batch = tokenizer(
        ["FAR freezes most FFN nodes.", "The rest keep learning, fast."], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        before = model(**batch).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}

    far.reconfigure(model, 0.4, selection="random")
    assert len(far.find_ffns(model)) == 6
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, atol=1e-5, rtol=0)

    far.restore(model)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
