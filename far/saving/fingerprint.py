"""Hashes that tie a learners-only file to its contents and to the base model it belongs to.

A learners-only file carries what FAR training changed; everything else comes from the base model
it is applied to. The *base fingerprint* hashes exactly that everything-else: every tensor of the
model except the ones the file overwrites, with the FFN projections reduced to their frozen nodes.
It is computed in the original (plain-model) names and layout, so a plain base and a model
reconfigured with the same learners give the same hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

import torch
from torch import Tensor, nn

from far.architectures import FFN, expand_nodes, projection_rows
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows

_Value = Callable[[Tensor], Tensor]  # a model tensor -> the value to hash for it


def _update(digest: hashlib._Hash, name: str, tensor: Tensor) -> None:
    # The header fixes the byte length of what follows, so the concatenation is unambiguous.
    header = json.dumps([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)])
    digest.update(header.encode() + b"\n")
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)  # any dtype, bf16 too
    digest.update(data.numpy().data)


def hash_tensors(tensors: Iterable[tuple[str, Tensor]], prefix: bytes = b"") -> str:
    """sha256 (hex) over `prefix`, then every (name, dtype, shape, bytes) in name order."""
    digest = hashlib.sha256(prefix)
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        _update(digest, name, tensor)
    return digest.hexdigest()


def complement(learners: Tensor, n_nodes: int) -> Tensor:
    """Sorted original indices of the nodes that are not learners."""
    is_learner = torch.zeros(n_nodes, dtype=torch.bool)
    is_learner[learners.cpu()] = True
    return torch.arange(n_nodes)[~is_learner]


def _split_rows(module: SplitLinear, value: _Value) -> tuple[Tensor, Tensor | None]:
    """A split projection's node rows (n, f) and node bias in ORIGINAL order (a copy)."""
    order = module.node_order.argsort()  # original node -> stored position
    rows = torch.cat([value(module.learner_weight), value(module.frozen_weight)])[order]
    bias = None
    if module.role == INPUT and module.learner_bias is not None:
        bias = torch.cat([value(module.learner_bias), value(module.frozen_bias)])[order]
    return rows, bias


def _frozen_part(module: nn.Module, role: str, frozen: Tensor, value: _Value) -> tuple[Tensor, Tensor | None]:
    """A projection's weight (nn.Linear layout) and node bias at the `frozen` original nodes."""
    if isinstance(module, SplitLinear):
        stored = module.node_order[module.n_learners :]
        if torch.equal(stored.sort().values.cpu(), frozen.cpu()):  # split with these very learners
            # Stored frozen nodes -> ascending original order (it already is, for FAR-built layers).
            perm = stored.argsort()
            rows = value(module.frozen_weight)[perm]
            bias = None
            if role == INPUT and module.frozen_bias is not None:
                bias = value(module.frozen_bias)[perm]
        else:  # split with other learners (another user's file is loaded): read every node back
            rows, bias = _split_rows(module, value)
            frozen = frozen.to(rows.device)
            rows, bias = rows[frozen], None if bias is None else bias[frozen]
    else:
        frozen = frozen.to(module.weight.device)
        rows = node_rows(module, role, value(module.weight))[frozen]
        bias = value(module.bias)[frozen] if role == INPUT and module.bias is not None else None
    return (rows if role == INPUT else rows.t()), bias  # hashed as (out, in), whatever the storage


def _base_tensors(
    model: nn.Module,
    ffns: Mapping[str, FFN],
    learners: Mapping[str, Tensor],
    stored: Collection[str],
    value: _Value,
) -> Iterator[tuple[str, Tensor]]:
    projections = {name for ffn in ffns.values() for name in (*ffn.inputs, ffn.output)}
    # A stored parameter is overwritten under every name it is tied to (e.g. lm_head.weight).
    overwritten = {id(model.get_parameter(name)) for name in stored}
    for key, tensor in model.state_dict(keep_vars=True).items():
        if key.rpartition(".")[0] not in projections and id(tensor) not in overwritten:
            yield key, value(tensor)
    for ffn in ffns.values():
        frozen = complement(learners[ffn.name], ffn.n_nodes)
        for name in (*ffn.inputs, ffn.output):
            module = model.get_submodule(name)
            role = INPUT if name in ffn.inputs else OUTPUT
            rows = expand_nodes(frozen, projection_rows(module, role) // ffn.n_nodes)  # a head is several rows
            weight, bias = _frozen_part(module, role, rows, value)
            yield f"{name}.weight[frozen]", weight
            if bias is not None:
                yield f"{name}.bias[frozen]", bias
            if role == OUTPUT and module.bias is not None and f"{name}.bias" not in stored:
                yield f"{name}.bias", value(module.bias)  # belongs to no node


@torch.no_grad()
def base_fingerprint(
    model: nn.Module,
    ffns: Mapping[str, FFN],
    learners: Mapping[str, Tensor],
    stored: Collection[str],
    *,
    base_values: Mapping[str, Tensor] | None = None,
) -> str:
    """sha256 of every value of `model` that a learners file with these contents does not overwrite.

    Args:
        model: A plain model, or one reconfigured with exactly `learners`.
        ffns: `far.find_ffns(model)`, plus the attention blocks where FAR splits them.
        learners: `{ffn_name: sorted original learner indices}`; their rows/columns are excluded.
        stored: Names of the non-learner parameters the file holds (trainable heads, norms, ...);
            they, and every name tied to them, are excluded.
        base_values: `{parameter name: value}` read in place of the model's own tensors: the base
            values of what a loaded learners file overwrote, so that another file is checked
            against the base without touching the model.

    Returns:
        A hex digest, equal for a plain base and the same base reconfigured with `learners`.
    """
    by_id = {id(model.get_parameter(name)): t for name, t in (base_values or {}).items()}

    def value(tensor: Tensor) -> Tensor:
        return by_id.get(id(tensor), tensor).detach()

    return hash_tensors(_base_tensors(model, ffns, learners, stored, value))
