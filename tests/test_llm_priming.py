"""Low-memory priming: FFN node scores from gradient magnitudes."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_causal_lm

import far
from far.training.gradient_priming import gradient_scores
from far.training.recompute import recomputes_layers


def model_and_batches(seed: int = 0):
    model = tiny_causal_lm("llama", seed)
    generator = torch.Generator().manual_seed(seed + 1)
    batches = [{"input_ids": torch.randint(3, 97, (3, 6), generator=generator)} for _ in range(3)]
    return model, batches


def lm_loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def reference_scores(model, batches):
    """The same scores the plain way: full gradients per batch, node L1 norms summed."""
    ffns = far.find_ffns(model)
    scores = {name: torch.zeros(ffn.n_nodes) for name, ffn in ffns.items()}
    for batch in batches:
        model.zero_grad()
        lm_loss(model, batch).backward()
        for name, ffn in ffns.items():
            for module_name in ffn.inputs:
                scores[name] += model.get_submodule(module_name).weight.grad.abs().sum(dim=1)
            scores[name] += model.get_submodule(name).weight.grad.abs().sum(dim=0)
    model.zero_grad(set_to_none=True)
    return scores


@pytest.mark.parametrize("checkpointing", [False, True])
def test_scores_are_summed_node_l1_norms_of_the_ffn_gradients(checkpointing):
    model, batches = model_and_batches()
    expected = reference_scores(model, batches)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = gradient_scores(model, batches, lm_loss, checkpointing=checkpointing)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched


@pytest.mark.slow
def test_everything_is_put_back_and_no_gradient_is_kept():
    model, batches = model_and_batches()
    model.model.embed_tokens.weight.requires_grad_(False)
    mine = torch.ones_like(model.model.layers[0].mlp.up_proj.weight)
    model.model.layers[0].mlp.up_proj.weight.grad = mine  # a caller's own gradient
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    gradient_scores(model, batches, lm_loss)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert not model.training and not recomputes_layers(model)
    assert not getattr(model, "_require_grads_hooks", None)
    assert model.model.layers[0].mlp.up_proj.weight.grad is mine
    assert all(p.grad is None for n, p in model.named_parameters() if "layers.0.mlp.up_proj" not in n)


def test_selection_from_the_scores_and_a_failing_loss_leaves_the_model_as_it_was():
    model, batches = model_and_batches()
    scores = gradient_scores(model, batches[:1], lm_loss)
    far.reconfigure(model, 0.5, scores=scores)
    assert all(idx.numel() == 20 for idx in far.learners(model).values())
    with pytest.raises(ValueError, match="already reconfigured"):
        gradient_scores(model, batches, lm_loss)

    model, batches = model_and_batches()

    def failing(model, batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        gradient_scores(model, batches, failing)
    assert all(p.requires_grad for p in model.parameters()) and not model.training
    assert not recomputes_layers(model)


@pytest.mark.slow
def test_head_scores_sum_each_key_value_groups_gradient_rows_and_columns():
    model, batches = model_and_batches()
    blocks = far.find_attention(model)
    expected = {name: torch.zeros(block.n_nodes) for name, block in blocks.items()}
    for batch in batches:
        model.zero_grad()
        lm_loss(model, batch).backward()
        for name, block in blocks.items():
            query, key, value, output = (model.get_submodule(n).weight.grad.abs() for n in block.projections)
            # 4 query heads of size 8 in 2 groups: a group is 16 query rows, 8 key and value rows, 16 output columns
            expected[name] += query.reshape(2, -1).sum(1) + key.reshape(2, -1).sum(1) + value.reshape(2, -1).sum(1)
            expected[name] += output.t().reshape(2, -1).sum(1)
    model.zero_grad(set_to_none=True)
    got = gradient_scores(model, batches, lm_loss, heads=True)
    assert set(got) == set(far.find_ffns(model)) | set(blocks)
    for name in blocks:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_prime_and_reconfigure_splits_heads_from_gradient_scores():
    model, batches = model_and_batches()
    far.training.prime_and_reconfigure(model, batches, lm_loss, retention=0.5, attention_retention=0.5)
    chosen = far.learners(model)
    assert all(chosen[name].numel() == 1 for name in far.find_attention(model))
    assert not model.get_input_embeddings().weight.requires_grad
