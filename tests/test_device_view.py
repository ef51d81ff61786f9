"""The export view (far.device.view) is the lean encoder's BERT forward over the model's own tensors.

Its loss, logits and gradients match the reconfigured model's (transformers' BERT with far.SplitLinear),
its trainable tensors are the model's, in the model's order, and its layers are `far.encoder.bert`'s
modules with no dropout left in them. No export: the views run in torch eager. The export's table of
architectures covers exactly those far.architectures reconfigures, causal LMs aside.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_causal_lm, tiny_model
from torch import nn

import far
from far.architectures import BUILTIN_SPECS, CAUSAL_LM_TYPES
from far.device.plan import EXPORTABLE, NOT_EXPORTABLE, plan_export
from far.device.program import build_views
from far.encoder.bert import BertEmbeddings, BertLayer


def _model(frozen_layers: int | None) -> nn.Module:
    torch.manual_seed(0)
    model = tiny_model("bert", num_labels=3)
    config = far.FARConfig(retention=0.5, selection="random", freeze_embeddings=True, freeze_layers=frozen_layers)
    return far.reconfigure(model, config)


@pytest.mark.parametrize("frozen_layers", [None, 1], ids=["whole", "frozen-bottom"])
def test_the_view_computes_what_the_model_computes(frozen_layers):
    model = _model(frozen_layers).eval()
    plan = plan_export(model, 12)
    bottom, top = build_views(model, plan)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 7:] = 0
    types, labels = torch.zeros_like(ids), torch.tensor([0, 1, 2, 1])

    loss, logits = top(bottom(ids, mask, types), mask, labels) if bottom else top(ids, mask, types, labels)
    loss.backward()
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    out.loss.backward()

    torch.testing.assert_close(logits, out.logits.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.detach(), out.loss.detach(), rtol=1e-5, atol=1e-6)
    model_grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    view_grads = {n: p.grad for n, p in top.named_parameters() if p.requires_grad}
    assert list(view_grads) == list(plan.trainable)  # the model's tensors, in the model's order
    for name, grad in view_grads.items():
        expected = model_grads[name]
        if expected.shape != grad.shape:  # an output projection's learners: (k, out) in the model, (out, k) here
            expected = expected.T
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6, msg=name)


def test_the_view_is_made_of_the_lean_encoders_modules_without_dropout():
    model = _model(1)
    bottom, top = build_views(model, plan_export(model, 12))
    modules = [*bottom.modules(), *top.modules()]
    assert sum(isinstance(m, BertLayer) for m in modules) == model.config.num_hidden_layers
    assert sum(isinstance(m, BertEmbeddings) for m in modules) == 1
    assert not any(isinstance(m, nn.Dropout) for m in modules)


def test_the_device_knows_only_architectures_far_knows():
    """The export's table is a view of far.architectures': what it exports or explains is reconfigurable."""
    assert set(EXPORTABLE) | set(NOT_EXPORTABLE) <= set(BUILTIN_SPECS) - CAUSAL_LM_TYPES
    assert set(BUILTIN_SPECS) - CAUSAL_LM_TYPES <= set(EXPORTABLE) | set(NOT_EXPORTABLE)


def test_a_causal_lm_is_refused_with_the_reason():
    model = far.reconfigure(tiny_causal_lm("llama"), retention=0.5, selection="random")
    with pytest.raises(ValueError, match="cannot export a 'llama' model to ExecuTorch: it is a causal LM"):
        plan_export(model, 8)
