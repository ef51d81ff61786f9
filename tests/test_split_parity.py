"""Exactness of the split FFN on every built-in architecture: outputs, gradients, bf16, no-grad passes."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_batch, tiny_model
from transformers.pytorch_utils import Conv1D

import far
from far.layers import INPUT, SplitLinear


def _scores(model):
    generator = torch.Generator().manual_seed(3)
    return {name: torch.rand(f.n_nodes, generator=generator) for name, f in far.find_ffns(model).items()}


def _backward(model, batch, seed=0):
    torch.manual_seed(seed)  # the same dropout masks in both models
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach()


@pytest.mark.parametrize("recompute", [False, True])
def test_logits_and_gradients_equal_the_unsplit_models(arch, recompute):
    reference = tiny_model(arch).train()
    model = far.reconfigure(copy.deepcopy(reference), 0.4, scores=_scores(reference), recompute_activations=recompute)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    torch.testing.assert_close(_backward(model, batch), _backward(reference, batch), atol=1e-6, rtol=1e-6)

    learners = far.learners(model)
    plain = dict(reference.named_modules())
    for ffn in far.find_ffns(reference).values():
        idx = learners[ffn.name]
        for name in (*ffn.inputs, ffn.output):
            split, original = model.get_submodule(name), plain[name]
            role = INPUT if name in ffn.inputs else "output"
            torch.testing.assert_close(split.learner_weight.grad, _grad_rows(original, role)[idx], atol=1e-6, rtol=1e-5)
            assert split.frozen_weight.grad is None
            if role == INPUT and original.bias is not None:
                torch.testing.assert_close(split.learner_bias.grad, original.bias.grad[idx], atol=1e-6, rtol=1e-5)
    split_names = {n for n, m in model.named_modules() if isinstance(m, SplitLinear)}
    for name, p in model.named_parameters():
        module_name, _, param = name.rpartition(".")
        if module_name in split_names and param != "bias":  # the node-split tensors, checked above
            continue
        expected = reference.get_parameter(name).grad
        assert (p.grad is None) == (expected is None), name
        if expected is not None:
            torch.testing.assert_close(p.grad, expected, atol=1e-6, rtol=1e-5, msg=name)


def _grad_rows(module, role):
    """A plain projection's weight gradient with one row per node (an oracle independent of far.layers)."""
    grad = module.weight.grad
    out_by_in = grad.t() if isinstance(module, Conv1D) else grad
    return out_by_in if role == INPUT else out_by_in.t()


def test_bf16_autocast_logits_are_the_unsplit_models(arch):
    reference = tiny_model(arch).eval()
    model = far.reconfigure(copy.deepcopy(reference), 0.4, scores=_scores(reference))
    batch = tiny_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = reference(**batch).logits.float(), model(**batch).logits.float()
    # The same bf16 products over the same bf16 weights; only the order of a few sums may differ.
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_no_grad_forward_matches_in_eval_and_after_an_optimizer_step(arch):
    reference = tiny_model(arch).train()
    model = far.reconfigure(copy.deepcopy(reference), 0.4, scores=_scores(reference))
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    _backward(model, batch)
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2).step()
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits
    restored = far.restore(copy.deepcopy(model)).eval()
    with torch.no_grad():
        torch.testing.assert_close(logits, restored(**batch).logits, atol=1e-6, rtol=1e-6)
