"""A reconfigured model -> its export views (`far.device.view`), with copies of its tensors (the model is
left as it is), and example inputs of the programs' fixed shapes.

    >>> plan = plan_export(model, max_length=64)
    >>> bottom, top = build_views(model, plan)
    >>> loss, logits = top(bottom(ids, mask, types), mask, labels)
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from far.device.plan import ExportPlan
from far.device.view import BottomView, SplitDown, SplitUp, TrainFromTokens, TrainView, embeddings, layer
from far.layers import SplitLinear
from far.saving.fingerprint import complement

# A BERT layer's post-LayerNorms, relative to the layer (far.architectures names the projections only).
_LAYER_NORMS = ("attention.output.LayerNorm", "output.LayerNorm")


def _copy(module: nn.Module) -> nn.Module:
    """A detached copy of a plain module keeping each tensor's requires_grad."""
    twin = copy.copy(module)
    twin._parameters = {
        name: None if p is None else nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        for name, p in module._parameters.items()
    }
    twin._buffers = {name: None if b is None else b.detach().clone() for name, b in module._buffers.items()}
    twin._modules = {}
    return twin


def _merged(module: nn.Module) -> tuple[Tensor, Tensor | None, bool]:
    """(weight (out, in) in original node order, bias, whether the bias trains) of an FFN projection."""
    linear = module.to_linear() if isinstance(module, SplitLinear) else module  # a merged copy; the bias is shared
    bias = linear.bias
    trains = bias is not None and bias.requires_grad
    return linear.weight.detach(), None if bias is None else bias.detach(), trains


def _layer(model: nn.Module, plan: ExportPlan, name: str) -> nn.Module:
    a = plan.attention  # the model's names of the projections, keyed by the view's
    names = {"attention.self.query": a.query, "attention.self.key": a.key, "attention.self.value": a.value}
    names |= {"attention.output.dense": a.output, **{norm: norm for norm in _LAYER_NORMS}}
    parts = {part: _copy(model.get_submodule(f"{name}.{source}")) for part, source in names.items()}
    ffn = next(f for f in plan.ffns.values() if f.name.startswith(f"{name}."))
    learners = plan.learners[ffn.name]
    frozen = complement(learners, ffn.n_nodes)
    (up_name,) = ffn.inputs
    up = model.get_submodule(up_name)
    trains = isinstance(up, SplitLinear) and up.learner_weight.requires_grad and learners.numel() > 0
    weight, bias, _ = _merged(up)
    parts["intermediate.dense"] = SplitUp(weight, bias, learners, frozen, trains)
    weight, bias, bias_trains = _merged(model.get_submodule(ffn.output))
    parts["output.dense"] = SplitDown(weight, bias, learners, frozen, trains, bias_trains)
    return layer(parts, plan.heads, plan.activation)


def _embeddings(model: nn.Module, plan: ExportPlan) -> nn.Module:
    parts = (
        f"{plan.layout.embeddings}.{p}"
        for p in ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")
    )
    return embeddings(*(_copy(model.get_submodule(p)) for p in parts))


@torch.no_grad()
def build_views(model: nn.Module, plan: ExportPlan) -> tuple[BottomView | None, TrainView]:
    """The forward-only bottom (None without one) and the training view of `model`, as `plan` says
    (ValueError if the view's trainable tensors are not the model's).
    """
    layers = {name: _layer(model, plan, name) for name in plan.layers}
    embeddings = _embeddings(model, plan)
    k = plan.frozen_layers if plan.bottom else 0
    bottom = None
    if plan.bottom:
        below = {plan.layout.embeddings: embeddings, **{n: layers[n] for n in plan.layers[:k]}}
        bottom = BottomView(below, plan.layout.embeddings, list(plan.layers[:k])).eval()
    head = {
        plan.layout.pooler: _copy(model.get_submodule(plan.layout.pooler)),
        plan.layout.classifier: _copy(model.get_submodule(plan.layout.classifier)),
    }
    above = {**{n: layers[n] for n in plan.layers[k:]}, **head}
    names = list(plan.layers[k:])
    if plan.bottom:
        top = TrainView(above, names, plan.layout.pooler, plan.layout.classifier, plan.regression)
    else:
        above = {plan.layout.embeddings: embeddings, **above}
        top = TrainFromTokens(
            above, plan.layout.embeddings, names, plan.layout.pooler, plan.layout.classifier, plan.regression
        )
    _check_trainable(plan, top)
    return bottom, top.train()


def trainable_tensors(view: nn.Module) -> dict[str, Tensor]:
    """`{name: tensor}` of the view's trainable parameters, in the view's order."""
    return {n: p for n, p in view.named_parameters() if p.requires_grad}


def _check_trainable(plan: ExportPlan, view: nn.Module) -> None:
    expected = set(plan.trainable)  # a SplitLinear's learner_weight/learner_bias keep their names in the view
    found = set(trainable_tensors(view))
    if found != expected:
        raise ValueError(
            "the export view would train other tensors than the model does: only in the model "
            f"{sorted(expected - found)[:3]}, only in the view {sorted(found - expected)[:3]}; far.device exports "
            "models whose trainable tensors are FFN learners and whole tensors of the trained layers and head"
        )


def example_inputs(plan: ExportPlan, batch_size: int, max_length: int) -> tuple[tuple, tuple | None]:
    """(training program inputs, bottom program inputs or None): zeros of the programs' shapes and dtypes."""
    ids = torch.zeros(batch_size, max_length, dtype=torch.long)
    mask = torch.ones(batch_size, max_length, dtype=torch.long)
    labels = torch.zeros(batch_size) if plan.regression else torch.zeros(batch_size, dtype=torch.long)
    if plan.bottom:
        hidden = torch.zeros(batch_size, max_length, plan.hidden_size)
        return (hidden, mask, labels), (ids, mask, ids.clone())
    return (ids, mask, ids.clone(), labels), None
