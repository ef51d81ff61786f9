"""Prompt-based classification with causal LMs: label-word logits, loss, accuracy, k-shot sets."""

from __future__ import annotations

import csv
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_causal_lm
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from far.data.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    PromptTemplate,
    accuracy,
    encode_prompts,
    label_logits,
    label_word_ids,
    predict,
    prompt_loss_fn,
    sample_k_shot,
)

WORDS = ["[PAD]", "[UNK]", "It", "was", "great", "terrible", "a", "film", "bad", "good", "plot", "very", "dull"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A real (word-level) fast tokenizer over a dozen words: no download."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def causal_lm(model_type: str = "llama", seed: int = 0) -> torch.nn.Module:
    # conftest's tiny model over this file's dozen-word vocabulary
    return tiny_causal_lm(model_type, seed, vocab_size=len(WORDS), pad_token_id=0)


SENTENCES = ["a great film", "a very dull plot", "bad", "a good film a good plot", "dull film"]
LABELS = [1, 0, 0, 1, 0]


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_label_logits_are_the_lm_logits_at_each_prompts_last_token(model_type, tokenizer):
    model = causal_lm(model_type)
    ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    batch = PromptCollator(0)(encode_prompts(tokenizer, SENTENCES, LABELS, SST2_TEMPLATE))
    assert batch["attention_mask"].sum(1).unique().numel() > 1  # rows of different lengths: padding matters
    got = label_logits(model, batch["input_ids"], batch["attention_mask"], ids)
    with torch.no_grad():
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    last = batch["attention_mask"].sum(1) - 1
    expected = full[torch.arange(len(SENTENCES)), last][:, ids]
    assert got.shape == (len(SENTENCES), 2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_loss_is_cross_entropy_over_the_label_words_and_has_gradients(tokenizer):
    model = causal_lm("llama")
    ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    batch = PromptCollator(0)(encode_prompts(tokenizer, SENTENCES, LABELS, SST2_TEMPLATE))
    loss = prompt_loss_fn(ids)(model, batch)
    logits = label_logits(model, batch["input_ids"], batch["attention_mask"], ids)
    torch.testing.assert_close(loss, F.cross_entropy(logits, batch["labels"]))
    loss.backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0


def test_predict_keeps_the_input_order_and_the_model_mode(tokenizer):
    model = causal_lm("llama").train()
    ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    examples = encode_prompts(tokenizer, SENTENCES, LABELS, SST2_TEMPLATE)
    got = predict(model, examples, ids, pad_token_id=0, batch_size=2)  # batches sorted by length inside
    assert model.training
    model.eval()
    one_by_one = []
    for example in examples:
        input_ids = torch.tensor([example["input_ids"]])
        one_by_one.append(int(label_logits(model, input_ids, torch.ones_like(input_ids), ids).argmax()))
    assert got.tolist() == one_by_one
    labels = torch.tensor(LABELS)
    assert accuracy(model, examples, ids, 0, batch_size=2) == pytest.approx(float((got == labels).float().mean()))


def test_encode_prompts_formats_and_keeps_the_end_when_truncating(tokenizer):
    (example,) = encode_prompts(tokenizer, ["a very dull plot "], [0], SST2_TEMPLATE)
    assert tokenizer.convert_ids_to_tokens(example["input_ids"]) == ["a", "very", "dull", "plot", "It", "was"]
    assert example["labels"] == 0
    (short,) = encode_prompts(tokenizer, ["a very dull plot"], [1], SST2_TEMPLATE, max_length=3)
    assert tokenizer.convert_ids_to_tokens(short["input_ids"]) == ["plot", "It", "was"]


def test_collator_pads_on_the_right():
    batch = PromptCollator(pad_token_id=5)([{"input_ids": [1, 2, 3], "labels": 1}, {"input_ids": [4], "labels": 0}])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0]


def test_bad_input_errors(tokenizer):
    with pytest.raises(ValueError, match="one token each"):
        label_word_ids(tokenizer, PromptTemplate("{sentence} It was", (" very great", " bad")))
    with pytest.raises(ValueError, match="'\\{sentence\\}' slot"):
        PromptTemplate("It was", (" great", " bad"))
    with pytest.raises(ValueError, match="two distinct label words"):
        PromptTemplate("{sentence}", (" great", " great"))
    with pytest.raises(ValueError, match="outside \\[0, 2\\)"):
        encode_prompts(tokenizer, ["a film"], [2], SST2_TEMPLATE)
    with pytest.raises(ValueError, match="1 sentences but 2 labels"):
        encode_prompts(tokenizer, ["a film"], [0, 1], SST2_TEMPLATE)
    with pytest.raises(ValueError, match="set tokenizer.pad_token"):
        PromptCollator(None)
    with pytest.raises(ValueError, match="no LM head"):
        label_logits(
            torch.nn.Module(), torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), torch.tensor([1])
        )
    with pytest.raises(ValueError, match="at least one example"):
        accuracy(causal_lm(), [], torch.tensor([4, 5]), 0)


def test_k_shot_sets_are_balanced_seeded_and_leave_the_global_rng_alone():
    labels = [0] * 30 + [1] * 50 + [2] * 20
    state = random.getstate()
    a = sample_k_shot(labels, 16, seed=3)
    assert random.getstate() == state
    assert len(a) == 48 == len(set(a))
    assert sorted(labels[i] for i in a) == [0] * 16 + [1] * 16 + [2] * 16
    assert a == sample_k_shot(labels, 16, seed=3)
    assert a != sample_k_shot(labels, 16, seed=4)
    assert [labels[i] for i in a[:16]] != sorted(labels[i] for i in a[:16])  # shuffled, classes interleaved
    with pytest.raises(ValueError, match="class 2 has only 20 examples, fewer than k=21"):
        sample_k_shot(labels, 21)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            sample_k_shot(labels, bad)


@pytest.mark.parametrize("k", [16, 512])
def test_k_shot_on_real_sst2(k, data_dir):
    with open(data_dir / "glue" / "SST-2" / "train.tsv", newline="") as f:
        labels = [int(row["label"]) for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    chosen = sample_k_shot(labels, k, seed=42)
    assert len(chosen) == 2 * k == len(set(chosen))
    assert sum(labels[i] for i in chosen) == k
    assert chosen == sample_k_shot(labels, k, seed=42)
