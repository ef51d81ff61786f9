"""Hashes that tie a learners-only file to its contents and to the base model it belongs to.

A learners-only file carries what FAR training changed; everything else comes from the base model
it is applied to. The *base fingerprint* hashes exactly that everything-else: every tensor of the
model except the ones the file overwrites, with the FFN projections reduced to their frozen nodes.
It is computed in the original (plain-model) names and layout, so a plain base and a model
reconfigured with the same learners give the same hash.

Two definitions, both sha256 over the items (a tensor, or a projection's frozen part) in name
order, each item preceded by a JSON header `[name, dtype, shape]`:

- version 1 (files of format version 1): the item's bytes follow its header. Every check reads
  every frozen byte again.
- version 2: the sha256 of the item's bytes follows its header instead; for a projection's frozen
  part (its frozen node rows, node-major: (rows, features), a node bias as (rows,)), the sha256 of
  the concatenated per-row sha256 digests, rows in ascending original order. Per-tensor and
  per-row digests are what a `DigestCache` keeps, so swapping users hashes only what changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from far.architectures import FFN, expand_nodes, projection_rows
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows
from far.saving.digests import DigestCache, as_rows, hash_tensors, json_header

FINGERPRINT_VERSION = 2
_V2_PREFIX = b"far.base_fingerprint/2\n"

_Value = Callable[[Tensor], Tensor]  # a model tensor -> the value to hash for it


def outside_split(model: nn.Module, names: Iterable[str]) -> list[str]:
    """`names` less the split layers' own tensors: the parameters a learners file keeps whole, under their names."""
    split = {
        f"{name}.{part}"
        for name, module in model.named_modules()
        if isinstance(module, SplitLinear)
        for part in ("learner_weight", "frozen_weight", "learner_bias", "frozen_bias")
    }
    return [name for name in names if name not in split]


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


def _covered(
    model: nn.Module, ffns: Mapping[str, FFN], learners: Mapping[str, Tensor], stored: Collection[str], value: _Value
) -> Iterator[tuple[str, Tensor | nn.Module, tuple[str, Tensor] | None]]:
    """What a base fingerprint covers, in the plain model's names: `(name, tensor, None)` for a whole tensor the
    file does not overwrite, `(projection name, module, (role, frozen rows))` for a projection's frozen rows.
    """
    projections = {name for ffn in ffns.values() for name in (*ffn.inputs, ffn.output)}
    # A stored parameter is overwritten under every name it is tied to (e.g. lm_head.weight).
    params = dict(model.named_parameters(remove_duplicate=False))
    overwritten = {id(params[name]) for name in stored}
    for key, tensor in model.state_dict(keep_vars=True).items():
        if key.rpartition(".")[0] not in projections and id(tensor) not in overwritten:
            yield key, value(tensor), None
    for ffn in ffns.values():
        frozen = complement(learners[ffn.name], ffn.n_nodes)
        for name in (*ffn.inputs, ffn.output):
            module = model.get_submodule(name)
            role = INPUT if name in ffn.inputs else OUTPUT
            rows = expand_nodes(frozen, projection_rows(module, role) // ffn.n_nodes)  # a head is several rows
            yield name, module, (role, rows)
            if role == OUTPUT and module.bias is not None and f"{name}.bias" not in stored:
                yield f"{name}.bias", value(module.bias), None  # belongs to no node


def _base_tensors(covered: Iterable, value: _Value) -> Iterator[tuple[str, Tensor]]:
    """(name, value) of every `_covered` item, for the version-1 fingerprint: the bytes themselves."""
    for name, item, frozen in covered:
        if frozen is None:
            yield name, item
            continue
        weight, bias = _frozen_part(item, frozen[0], frozen[1], value)
        yield f"{name}.weight[frozen]", weight
        if bias is not None:
            yield f"{name}.bias[frozen]", bias


def base_reader(model: nn.Module, base_values: Mapping[str, Tensor] | None) -> _Value:
    """A model tensor -> its base value: from `base_values` (by parameter name) where a loaded file overwrote it."""
    base_values = base_values or {}
    named = model.named_parameters(remove_duplicate=False)  # every name, tied ones too
    by_id = {id(p): base_values[name] for name, p in named if name in base_values}

    def value(tensor: Tensor) -> Tensor:
        return by_id.get(id(tensor), tensor).detach()

    return value


def node_digests(module: nn.Module, role: str, part: str, value: _Value, digests: DigestCache) -> np.ndarray | None:
    """(n_rows, 32): each node row's digest of a projection's weight or node bias (None where it has none),
    in original row order, read through `value`.
    """
    if isinstance(module, SplitLinear):
        learn, frozen = (
            (module.learner_weight, module.frozen_weight)
            if part == "weight"
            else (module.learner_bias, module.frozen_bias)
        )
        if learn is None:
            return None
        stored = np.concatenate([digests.rows(as_rows(value(learn))), digests.rows(as_rows(value(frozen)))])
        table = np.empty_like(stored)
        table[module.node_order.cpu().numpy()] = stored  # stored position -> original row
        return table
    if part == "weight":
        return digests.rows(node_rows(module, role, value(module.weight)))
    if role != INPUT or module.bias is None:
        return None
    return digests.rows(as_rows(value(module.bias)))


def _features(module: nn.Module, role: str) -> int:
    return module.learner_weight.shape[1] if isinstance(module, SplitLinear) else node_rows(module, role).shape[1]


def _digest_items(
    covered: Iterable, value: _Value, digests: DigestCache
) -> Iterator[tuple[str, torch.dtype, tuple[int, ...], bytes]]:
    """(name, dtype, shape, sha256) of every `_covered` item, for the version-2 fingerprint."""
    for name, item, frozen in covered:
        if frozen is None:
            yield name, item.dtype, tuple(item.shape), digests.tensor(item)
            continue
        role, rows = frozen[0], frozen[1].numpy()
        weight = item.learner_weight if isinstance(item, SplitLinear) else item.weight
        table = node_digests(item, role, "weight", value, digests)
        yield f"{name}.weight[frozen]", weight.dtype, (len(rows), _features(item, role)), _combined(table, rows)
        bias_table = node_digests(item, role, "bias", value, digests)
        if bias_table is not None:
            yield f"{name}.bias[frozen]", weight.dtype, (len(rows),), _combined(bias_table, rows)


def _combined(table: np.ndarray, rows: np.ndarray) -> bytes:
    """One digest of the chosen rows' digests, in row order."""
    return hashlib.sha256(table[rows].tobytes()).digest()


def _fingerprint_v2(items: Iterable[tuple[str, torch.dtype, tuple[int, ...], bytes]]) -> str:
    digest = hashlib.sha256(_V2_PREFIX)
    for name, dtype, shape, item in sorted(items, key=lambda item: item[0]):
        digest.update(json_header(name, str(dtype).removeprefix("torch."), list(shape)) + item)  # 32 bytes: unambiguous
    return digest.hexdigest()


@torch.no_grad()
def base_fingerprint(
    model: nn.Module,
    ffns: Mapping[str, FFN],
    learners: Mapping[str, Tensor],
    stored: Collection[str],
    *,
    base_values: Mapping[str, Tensor] | None = None,
    version: int = FINGERPRINT_VERSION,
    digests: DigestCache | None = None,
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
        version: The definition (see the module docstring): 2 for new files, 1 to check old ones.
        digests: Version 2 only: the cache to read digests from and keep them in (a user swap
            passes the one it keeps on the model); None hashes everything afresh.

    Returns:
        A hex digest, equal for a plain base and the same base reconfigured with `learners`.
    """
    if version not in (1, 2):
        raise ValueError(f"unknown base fingerprint version {version!r}; this version of far knows 1 and 2")
    value = base_reader(model, base_values)
    covered = _covered(model, ffns, learners, stored, value)
    if version == 1:
        return hash_tensors(_base_tensors(covered, value))
    return _fingerprint_v2(_digest_items(covered, value, DigestCache() if digests is None else digests))
