"""The split FFN under `torch.compile`: one graph, no break, and the eager model's loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from conftest import tiny_batch, tiny_model

import far

pytestmark = pytest.mark.slow  # Dynamo traces the whole model: seconds, not milliseconds


def _far_model(recompute: bool) -> torch.nn.Module:
    model = tiny_model("bert")
    generator = torch.Generator().manual_seed(3)
    scores = {name: torch.rand(f.n_nodes, generator=generator) for name, f in far.find_ffns(model).items()}
    return far.reconfigure(
        model, 0.4, scores=scores, freeze_embeddings=True, freeze_layers=1, recompute_activations=recompute
    )


def _loss(model, batch):
    return model(**batch).loss


@pytest.mark.parametrize("recompute", [False, True])
def test_the_split_model_traces_into_one_graph(recompute):
    torch._dynamo.reset()
    model = _far_model(recompute).train()
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    explained = torch._dynamo.explain(lambda **b: _loss(model, b))(**batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


@pytest.mark.parametrize("recompute", [False, True])
def test_compiled_loss_and_gradients_equal_eager(recompute):
    torch._dynamo.reset()
    eager = _far_model(recompute).eval()  # no dropout: both passes see the same network
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    reference = _loss(eager, batch)
    reference.backward()
    loss = _loss(compiled, batch)
    loss.backward()
    torch.testing.assert_close(loss, reference, atol=1e-6, rtol=1e-6)
    grads = {n: p.grad for n, p in eager.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    for name, param in compiled_model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, grads[name], atol=1e-6, rtol=1e-5)
        else:
            assert param.grad is None, name
