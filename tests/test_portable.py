"""Portable learners files: after priming, what FAR freezes is the stock model again, so files fit it."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_batch, tiny_examples, tiny_model

import far

LABELS = torch.tensor([0, 1, 2])


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**tiny_batch()).logits


def finetuned(**options) -> torch.nn.Module:
    """A tiny BERT primed 2 AdamW steps (every weight moves), then trained 3 more."""
    model = tiny_model("bert")
    run = dict(optimizer="adamw", lr=1e-2, priming=2, max_steps=5, batch_size=6, progress=False)
    far.finetune(model, tiny_examples(), **(run | options))
    return model.eval()


@pytest.mark.parametrize(
    "options",
    [{}, {"freeze_embeddings": True}, {"freeze_embeddings": True, "attention_retention": 0.5}],
    ids=["ffn", "frozen-embeddings", "heads"],
)
def test_a_finetuned_file_loads_onto_the_stock_model_bit_for_bit(tmp_path, options):
    model = finetuned(**options)
    path = far.save_learners(model, tmp_path / "user.safetensors")
    stock = tiny_model("bert")
    assert not torch.equal(logits(stock), logits(model))
    far.load_learners(stock, path)
    assert torch.equal(logits(stock), logits(model))
    for (name, a), b in zip(model.state_dict().items(), stock.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_frozen_values_are_the_pretrained_ones_and_learners_keep_their_primed_values():
    model, pretrained = tiny_model("bert"), tiny_model("bert")
    primer = far.Primer(model, embeddings=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):  # priming moves every weight
        model(**tiny_batch(), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    primed = copy.deepcopy(model)
    far.reconfigure(model, 0.4, scores=primer, freeze_embeddings=True)
    far.restore(model)  # the plain layout again, to compare tensor by tensor
    chosen = far.learners(far.reconfigure(copy.deepcopy(primed), 0.4, scores=primer.scores(), reset_frozen=False))
    for ffn in far.find_ffns(model).values():
        is_learner = torch.zeros(ffn.n_nodes, dtype=torch.bool)
        is_learner[chosen[ffn.name]] = True
        rows = model.get_submodule(ffn.inputs[0]).weight
        assert torch.equal(rows[~is_learner], pretrained.get_submodule(ffn.inputs[0]).weight[~is_learner])
        assert torch.equal(rows[is_learner], primed.get_submodule(ffn.inputs[0]).weight[is_learner])
    word = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(model.get_parameter(word), pretrained.get_parameter(word))
    attention = "bert.encoder.layer.0.attention.self.query.weight"  # trains on: keeps its primed value
    assert torch.equal(model.get_parameter(attention), primed.get_parameter(attention))
    assert not torch.equal(model.get_parameter(attention), pretrained.get_parameter(attention))


def test_reset_frozen_false_keeps_the_primed_values_and_ties_the_file_to_the_primed_model(tmp_path):
    model = finetuned(reset_frozen=False, freeze_embeddings=True)
    path = far.save_learners(model, tmp_path / "user.safetensors")
    with pytest.raises(far.saving.LearnersFileError, match="reset_frozen=False"):
        far.load_learners(tiny_model("bert"), path)
    primed = far.restore(copy.deepcopy(model))  # the primed base (its learners get overwritten)
    far.load_learners(primed, path)
    assert torch.equal(logits(primed), logits(model))


def test_a_primer_without_the_embeddings_is_refused_before_the_surgery():
    model = tiny_model("bert")
    far.Primer(model)
    with torch.no_grad():
        model.bert.encoder.layer[0].intermediate.dense.weight.add_(0.1)  # "priming"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"far.Primer\(model, embeddings=True\)"):
        far.reconfigure(model, 0.4, freeze_embeddings=True)
    assert not far.is_reconfigured(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    far.reconfigure(model, 0.4, freeze_embeddings=True, reset_frozen=False)  # the explicit way out
    with pytest.raises(TypeError, match="reset_frozen must be True or False"):
        far.reconfigure(far.restore(model), 0.4, selection="random", reset_frozen="yes")
