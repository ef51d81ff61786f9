"""Learner-only files: what FAR training changed, as one safetensors file, applied back onto a base.

Layout of a file (format version 2; version 1 differs only in its base fingerprint, and is read too):

- `<ffn>.learner_indices` (k,) int64: sorted original indices of the FFN's learner nodes (for a
  split attention block, keyed by its output projection: its learner heads);
- `<projection>.learner_weight` (k, in) for input projections, (out, k) for the output projection,
  in nn.Linear layout and ascending node order; `<projection>.learner_bias` (k,) for input
  projections with a bias (k rows are k * width for attention: a head is `width` rows);
- every other trainable parameter under its own name (heads, norms, attention, embeddings, the
  output projection's bias).

The metadata records the format, the `FARConfig`, the model type, the FFN layout, a fingerprint
of the base weights the file was trained from (see `far.saving.fingerprint`: version 2, built from
per-tensor and per-row digests, which a model that swaps users keeps) and a sha256 of the file's own
contents, so a flipped byte or a file for another base is refused before anything is
loaded. It also keeps what the model's Hugging Face config says beyond its defaults (`model_config`),
with the head's size, class names and problem type always (`far.saving.labels`), so that the head a
file trained can be rebuilt on a bare base (`learners_model_config`).

Reading a file and every check made before the model is touched are `far.saving.learners_read`; the
verified read itself (sha256, no unpickling) is `far.saving.safetensors_file`, shared with the GGUF
causal LM's learners files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from far.architectures import FFNSpec, NodeGroup, model_type
from far.layers import INPUT, OUTPUT, SplitLinear
from far.saving.active import ActiveLearners, active_learners, remember, revert
from far.saving.digests import DigestCache, as_rows
from far.saving.fingerprint import base_fingerprint, base_reader, node_digests, outside_split
from far.saving.labels import head_fields, set_head_fields
from far.saving.learners_read import (
    FORMAT,
    FORMAT_VERSION,
    READABLE,
    LearnersFileError,
    check_against_model,
    read_learners,
    same_layout,
)
from far.saving.safetensors_file import CONTENT_KEY, content_sha256
from far.storage.atomic import atomic_file
from far.surgery.reconfigure import reconfigure_with_learners, resplit, restore
from far.surgery.state import get_config, is_reconfigured, learners, node_groups

_MODEL_CONFIG_KEY = "model_config"


def _sorted_learner_part(module: SplitLinear) -> tuple[Tensor, Tensor | None]:
    """Learner weight (and input bias) with nodes in ascending original order."""
    perm = module.node_order[: module.n_learners].argsort()  # identity for FAR-built layers
    rows = module.learner_weight[perm]  # (k, f), nodes as rows
    if module.role == INPUT:
        bias = None if module.learner_bias is None else module.learner_bias[perm]
        return rows, bias
    return rows.t().contiguous(), None  # the file keeps nn.Linear's (out, k)


@torch.no_grad()
def save_learners(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    spec: FFNSpec | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write only what FAR training changed to one safetensors file, atomically.

    The file holds every FFN's learner weights and biases with their original node indices, plus
    every other trainable parameter; frozen FFN nodes and frozen tensors stay with the base model.

    Args:
        model: A model reconfigured by `far.reconfigure` (typically after training).
        path: Where to write, e.g. `"user-42.safetensors"`; an existing file is replaced only
            once the new one is complete.
        spec: FFN layout for architectures that are not built in.
        metadata: More entries for the file's metadata (str -> str, under names of their own), e.g. the
            digest of the shared layout the run trained with (`far.saving.shared_layout.layout_metadata`).

    Returns:
        The path written.

    Example:
        >>> far.save_learners(model, "learners.safetensors")
        >>> base = AutoModelForSequenceClassification.from_pretrained(base_path)
        >>> far.load_learners(base, "learners.safetensors")  # now equal to `model`
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    config = get_config(model)
    if config is None or not is_reconfigured(model):
        raise ValueError(
            "save_learners saves what FAR training changed, and this model is not reconfigured by FAR; "
            "call far.reconfigure(model, ...) before training, or use far.save_pretrained for a full checkpoint"
        )
    ffns = node_groups(model, spec)  # the FFNs, and the attention blocks if FAR split them
    chosen = learners(model, spec)
    tensors: dict[str, Tensor] = {}
    for ffn in ffns.values():
        tensors[f"{ffn.name}.learner_indices"] = chosen[ffn.name].to("cpu", torch.int64)
        for name in (*ffn.inputs, ffn.output):
            weight, bias = _sorted_learner_part(model.get_submodule(name))
            tensors[f"{name}.learner_weight"] = weight
            if bias is not None:
                tensors[f"{name}.learner_bias"] = bias
    others = outside_split(model, [n for n, p in model.named_parameters() if p.requires_grad])
    clash = sorted(set(others) & set(tensors))
    if clash:
        raise ValueError(f"parameter names {clash[:3]} collide with the learners file layout; rename them")
    for name in others:
        tensors[name] = model.get_parameter(name)
    # Own, contiguous CPU copies: safetensors refuses shared storage and the model may be on GPU.
    tensors = {k: t.detach().to("cpu", copy=True).contiguous() for k, t in tensors.items()}
    extra = dict(metadata or {})
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "far_config": json.dumps(config.to_dict(), sort_keys=True),
        "retention": repr(config.retention),
        "selection": config.selection,
        "model_type": str(model_type(model)),
        "ffns": json.dumps({ffn.name: list(ffn.inputs) for ffn in ffns.values()}),
        "base_fingerprint": base_fingerprint(model, ffns, chosen, others, version=READABLE[FORMAT_VERSION]),
    }
    hf_config = getattr(model, "config", None)
    if hasattr(hf_config, "to_diff_dict"):  # the head's size, labels and problem type travel with the file
        recorded = {**hf_config.to_diff_dict(), **head_fields(model)}
        metadata[_MODEL_CONFIG_KEY] = json.dumps(recorded, sort_keys=True, default=str)
    taken = sorted(set(extra) & {*metadata, CONTENT_KEY})
    if taken or not all(isinstance(v, str) for v in extra.values()):
        raise ValueError(f"metadata must map new names to strings; {taken or 'a value'} cannot be written")
    metadata.update(extra)
    metadata[CONTENT_KEY] = content_sha256(metadata, tensors)
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def learners_model_config(path: str | os.PathLike) -> dict:
    """The Hugging Face config (its non-default fields) of the model a learners file was saved from.

    The file is verified first (as `load_learners` does); a file written without it gives {}.

    Example:
        >>> far.saving.learners_model_config("user-42.safetensors")["id2label"]
        {'0': 'negative', '1': 'positive'}
    """
    metadata, _ = read_learners(Path(path))
    return _recorded_config(Path(path), metadata)


def _recorded_config(path: Path, metadata: Mapping[str, str]) -> dict:
    try:
        config = json.loads(metadata.get(_MODEL_CONFIG_KEY, "{}"))
    except ValueError as error:
        raise LearnersFileError(
            f"{str(path)!r} has an invalid model_config: {error}; write it again with far.save_learners"
        ) from error
    return config if isinstance(config, dict) else {}


def _node_tables(
    model: nn.Module, groups: Mapping[str, NodeGroup], active: ActiveLearners | None, digests: DigestCache
) -> dict[str, dict[str, np.ndarray]]:
    """{projection: {"weight"|"bias": (n_rows, 32) base digests, original order}}, from the cache."""
    value = base_reader(model, None if active is None else active.base)
    tables = {}
    for ffn in groups.values():
        for name in (*ffn.inputs, ffn.output):
            role = INPUT if name in ffn.inputs else OUTPUT
            module = model.get_submodule(name)
            parts = {part: node_digests(module, role, part, value, digests) for part in ("weight", "bias")}
            tables[name] = {part: table for part, table in parts.items() if table is not None}
    return tables


def _move_node_digests(
    modules: Mapping[str, nn.Module], tables: Mapping[str, Mapping[str, np.ndarray]], active: ActiveLearners
) -> None:
    """Record the node-row digests of the base values where the swap moved them: the swap only moved base rows
    (and kept copies), so these are exactly their digests and nothing is hashed again.
    """
    for name, module in modules.items():
        order, k = module.node_order.cpu().numpy(), module.n_learners  # stored position -> original row
        for part, table in tables.get(name, {}).items():
            learners, frozen = f"{name}.learner_{part}", getattr(module, f"frozen_{part}")
            active.digests.put_rows(as_rows(active.base[learners]), table[order[:k]])
            active.digests.put_rows(as_rows(frozen.detach()), table[order[k:]])


@torch.no_grad()
def load_learners(model: nn.Module, path: str | os.PathLike, *, spec: FFNSpec | None = None) -> nn.Module:
    """Apply a file written by `far.save_learners` to its base model, in place.

    A plain base is reconfigured with the recorded learners first; a model reconfigured with the same learners
    and config is updated as it is. On a model holding another user's file, that file's changes are undone
    first, so the model then computes exactly base + this file; it keeps a copy of the base values this file
    overwrites for that (`far.saving.unload_learners` gives the base back). The file's head labels and problem
    type go on `model.config` too.

    Everything is checked before the model is touched: the file's sha256, format version, model type, FFN
    layout, every shape and dtype, and the base fingerprint; a failing file leaves the model as it was.
    Swapping stays cheap without skipping a check: the model keeps its base values' digests and the files it
    verified, and when only the learners differ each projection's rows move within their own storage.

    Args:
        model: The base model the file was trained from (plain, reconfigured the same way, or holding
            another file for the same base).
        path: A learners file.
        spec: FFN layout for architectures that are not built in.

    Returns:
        The same model object, now equal to the model that was saved.

    Raises:
        LearnersFileError (a ValueError): the file is corrupted, truncated, not a FAR learners file, of an
            unknown version, or belongs to another architecture or base model, or to one with a head of
            another size (the message gives both sizes) or another dtype.

    Example:
        >>> far.load_learners(base, "user-a.safetensors")
        >>> far.load_learners(base, "user-b.safetensors")  # swaps A out: base + B, bit for bit
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    path = Path(path)
    active = active_learners(model)
    # What a swapping model keeps across swaps: the base's digests and the files already verified.
    digests = DigestCache() if active is None else active.digests
    verified = {} if active is None else active.verified
    metadata, tensors = read_learners(path, verified)
    config, chosen, others, groups = check_against_model(path, model, metadata, tensors, spec, active, digests)
    labels = _recorded_config(path, metadata)  # what the file says of its head: its labels, for model.config
    # The base's node-row digests, original order: the check just read them (a version-2 file).
    tables = _node_tables(model, groups, active, digests) if metadata["format_version"] != "1" else {}
    # Everything is verified; from here on nothing raises on bad input.
    relayout = not is_reconfigured(model)
    if active is not None:
        revert(model, active)  # the base values again, in the active file's layout
        relayout = active.relayout
        if not same_layout(model, config, chosen, spec) and not resplit(model, chosen, config, spec=spec):
            restore(model)
    if not is_reconfigured(model):
        reconfigure_with_learners(model, chosen, config, spec=spec)
    # The same groups as checked: the model is now split as `config` says.
    modules = {name: model.get_submodule(name) for group in groups.values() for name in group.projections}
    overwritten = [
        f"{name}.{part}"
        for name, module in modules.items()
        for part in ("learner_weight", "learner_bias")
        if getattr(module, part, None) is not None
    ]
    active = remember(
        model,
        [*overwritten, *others],
        path=str(path),
        content_sha256=metadata[CONTENT_KEY],
        relayout=relayout,
        digests=digests,
        verified=verified,
    )
    _move_node_digests(modules, tables, active)
    for name, module in modules.items():
        k = module.n_learners
        perm = module.node_order[:k].argsort()  # file row -> stored position (FAR stores them in order)
        in_order = bool((perm == torch.arange(k, device=perm.device)).all())
        device = module.learner_weight.device
        for part in ("weight", "bias"):
            target = getattr(module, f"learner_{part}")
            if target is None:  # no node bias (an output projection's bias is no node's)
                continue
            rows = tensors[f"{name}.learner_{part}"].to(device)
            rows = rows.t() if part == "weight" and module.role == OUTPUT else rows  # the file keeps (out, k)
            if in_order:
                target.copy_(rows)
            else:
                target.index_copy_(0, perm, rows)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name in others:
        params[name].copy_(tensors[name])
    set_head_fields(model, labels)
    return model
