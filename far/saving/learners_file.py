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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from far.architectures import FFNSpec, NodeGroup, model_type, projection_rows
from far.config import FARConfig
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows
from far.saving.active import ActiveLearners, active_learners, remember, revert
from far.saving.digests import DigestCache, as_rows, content_sha256
from far.saving.fingerprint import base_fingerprint, base_reader, node_digests
from far.saving.labels import head_fields, set_head_fields
from far.storage.atomic import atomic_file
from far.surgery.reconfigure import reconfigure_with_learners, resplit, restore
from far.surgery.state import get_config, is_reconfigured, learners, node_groups

FORMAT = "far.learners"
FORMAT_VERSION = "2"
_READABLE = {"1": 1, "2": 2}  # format version -> its base fingerprint version
_CONTENT_KEY = "content_sha256"
_MAX_VERIFIED = 4096  # files a swapping model remembers as verified (a few hundred bytes each)
_SETTLED_NS = 2_000_000_000  # a file written this recently is hashed on every load
_MODEL_CONFIG_KEY = "model_config"
# How to load a file onto the right base, from Python and from the command line.
_ONTO_ITS_BASE = "load it onto the base model it was trained from (far predict: --model BASE)"


class LearnersFileError(ValueError):
    """A learners file that cannot be applied: corrupted, truncated, foreign or for another base."""


def _sorted_learner_part(module: SplitLinear) -> tuple[Tensor, Tensor | None]:
    """Learner weight (and input-projection bias) with nodes in ascending original order."""
    perm = module.node_order[: module.n_learners].argsort()  # identity for FAR-built layers
    rows = module.learner_weight[perm]  # (k, f), nodes as rows
    if module.role == INPUT:
        bias = None if module.learner_bias is None else module.learner_bias[perm]
        return rows, bias
    return rows.t().contiguous(), None  # the file keeps nn.Linear's (out, k)


@torch.no_grad()
def save_learners(model: nn.Module, path: str | os.PathLike, *, spec: FFNSpec | None = None) -> Path:
    """Write only what FAR training changed to one safetensors file, atomically.

    The file holds every FFN's learner weights and biases with their original node indices, plus
    every other trainable parameter; frozen FFN nodes and frozen tensors stay with the base model.

    Args:
        model: A model reconfigured by `far.reconfigure` (typically after training).
        path: Where to write, e.g. `"user-42.safetensors"`; an existing file is replaced only
            once the new one is complete.
        spec: FFN layout for architectures that are not built in.

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
    split_params = {
        f"{module_name}.{p}"
        for module_name, module in model.named_modules()
        if isinstance(module, SplitLinear)
        for p in ("learner_weight", "frozen_weight", "learner_bias", "frozen_bias")
    }
    others = [n for n, p in model.named_parameters() if p.requires_grad and n not in split_params]
    clash = sorted(set(others) & set(tensors))
    if clash:
        raise ValueError(f"parameter names {clash[:3]} collide with the learners file layout; rename them")
    for name in others:
        tensors[name] = model.get_parameter(name)
    # Own, contiguous CPU copies: safetensors refuses shared storage and the model may be on GPU.
    tensors = {k: t.detach().to("cpu", copy=True).contiguous() for k, t in tensors.items()}
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "far_config": json.dumps(config.to_dict(), sort_keys=True),
        "retention": repr(config.retention),
        "selection": config.selection,
        "model_type": str(model_type(model)),
        "ffns": json.dumps({ffn.name: list(ffn.inputs) for ffn in ffns.values()}),
        "base_fingerprint": base_fingerprint(model, ffns, chosen, others, version=_READABLE[FORMAT_VERSION]),
    }
    hf_config = getattr(model, "config", None)
    if hasattr(hf_config, "to_diff_dict"):  # the head's size, labels and problem type travel with the file
        recorded = {**hf_config.to_diff_dict(), **head_fields(model)}
        metadata[_MODEL_CONFIG_KEY] = json.dumps(recorded, sort_keys=True, default=str)
    metadata[_CONTENT_KEY] = content_sha256(metadata, tensors.items())
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def _file_identity(path: Path) -> tuple[int, ...]:
    """What changes whenever a file's bytes do: any write moves its ctime, a new file is a new inode."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read(path: Path, verified: dict[tuple, str] | None = None) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensors of a verified learners file; raises before anything is used.

    `verified` ({file identity: content sha256}, kept on a model that swaps users) skips hashing a
    file this process has verified before and that has not changed since (same inode, size, mtime
    and ctime, before and after this read); a file not in it is verified and added, once its last
    write is `_SETTLED_NS` old: a write in the same timestamp tick as the one verified would leave
    its ctime as it was (git's "racily clean" files), so a recent file is hashed every time.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no learners file at {str(path)!r}; write one with far.save_learners(model, path)")
    try:
        identity = _file_identity(path)
        with safe_open(path, framework="pt") as f:  # safetensors only: nothing is ever unpickled
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        unchanged = _file_identity(path) == identity  # no write while it was read
    except Exception as error:  # SafetensorError and OSError alike: the file is unreadable
        raise LearnersFileError(
            f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?): {error}. "
            "Write it again with far.save_learners"
        ) from error
    if metadata.get("format") != FORMAT:
        raise LearnersFileError(
            f"{str(path)!r} has no FAR learners metadata (format={metadata.get('format')!r}); "
            "only files written by far.save_learners can be loaded"
        )
    if metadata.get("format_version") not in _READABLE:
        raise LearnersFileError(
            f"{str(path)!r} is a learners file of format version {metadata.get('format_version')!r}, "
            f"this version of far reads versions {' and '.join(_READABLE)}; upgrade far or re-export the file"
        )
    recorded = metadata.get(_CONTENT_KEY)
    if unchanged and verified is not None and recorded is not None and verified.get(identity) == recorded:
        return metadata, tensors  # these very bytes matched their sha256 before
    if recorded != content_sha256(metadata, tensors.items()):
        raise LearnersFileError(
            f"{str(path)!r} is corrupted: its contents do not match the sha256 recorded when it was written"
        )
    if unchanged and verified is not None and identity[-1] < time.time_ns() - _SETTLED_NS:
        if len(verified) >= _MAX_VERIFIED:
            verified.clear()
        verified[identity] = recorded
    return metadata, tensors


def learners_model_config(path: str | os.PathLike) -> dict:
    """The Hugging Face config (its non-default fields) of the model a learners file was saved from.

    The file is verified first (as `load_learners` does); a file written without it gives {}.

    Example:
        >>> far.saving.learners_model_config("user-42.safetensors")["id2label"]
        {'0': 'negative', '1': 'positive'}
    """
    metadata, _ = _read(Path(path))
    return _recorded_config(Path(path), metadata)


def _recorded_config(path: Path, metadata: Mapping[str, str]) -> dict:
    try:
        config = json.loads(metadata.get(_MODEL_CONFIG_KEY, "{}"))
    except ValueError as error:
        raise LearnersFileError(
            f"{str(path)!r} has an invalid model_config: {error}; write it again with far.save_learners"
        ) from error
    return config if isinstance(config, dict) else {}


_REQUIRED = ("far_config", "model_type", "ffns", "base_fingerprint")


def _parse(path: Path, metadata: Mapping[str, str]) -> tuple[FARConfig, dict[str, list[str]]]:
    missing = [key for key in _REQUIRED if key not in metadata]
    if missing:
        raise LearnersFileError(f"{str(path)!r} lacks the metadata {missing}; write it again with far.save_learners")
    try:
        config = FARConfig(**json.loads(metadata["far_config"]))
        layout = json.loads(metadata["ffns"])
    except (TypeError, ValueError) as error:
        raise LearnersFileError(f"{str(path)!r} has invalid metadata: {error}") from error
    if not isinstance(layout, dict):
        raise LearnersFileError(f"{str(path)!r} has invalid metadata: 'ffns' is not a JSON object")
    return config, layout


def _linear_shape(module: nn.Module) -> tuple[tuple[int, int], torch.dtype, bool]:
    """(out, in) in nn.Linear layout, weight dtype, and whether the projection has a bias."""
    if isinstance(module, SplitLinear):
        has_bias = (module.learner_bias if module.role == INPUT else module.bias) is not None
        return (module.out_features, module.in_features), module.learner_weight.dtype, has_bias
    out_f, in_f = node_rows(module, INPUT).shape  # an input projection's node rows are nn.Linear's layout
    return (out_f, in_f), module.weight.dtype, module.bias is not None


def _expect(
    path: Path,
    tensors: Mapping[str, Tensor],
    key: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    head_size: int | None = None,
) -> None:
    """Raise unless the file's `key` has `shape` and `dtype`; `head_size`: the model's number of labels,
    for a whole parameter (a task head's rows are its labels)."""
    tensor = tensors.get(key)
    if tensor is None:
        raise LearnersFileError(f"{str(path)!r} lacks the tensor {key!r} its metadata announces")
    found, needed = tuple(tensor.shape), tuple(shape)
    if found != needed or tensor.dtype != dtype:
        raise LearnersFileError(
            f"{str(path)!r}: {key} is {found} {tensor.dtype}, the model needs {needed} {dtype}; "
            + _why_mismatch(found, needed, tensor.dtype, dtype, head_size)
        )


def _why_mismatch(
    found: tuple[int, ...],
    needed: tuple[int, ...],
    dtype: torch.dtype,
    needed_dtype: torch.dtype,
    head_size: int | None,
) -> str:
    """The cause of a tensor that does not fit, and what to do: the head's size, the dtype, or another model."""
    if head_size is not None and len(found) == len(needed) and found[1:] == needed[1:] and needed[0] == head_size:
        # Only the rows differ, and the model has that many labels: a task head of another size.
        return (
            f"the file's head has {found[0]} output(s) and the model's {head_size}: build the base with "
            f"num_labels={found[0]} (far predict reads it from the file's recorded config)"
        )
    if found == needed:
        return (
            f"the file holds {dtype} values and the model {needed_dtype}: load the base in {dtype} "
            f"(from_pretrained(..., dtype={dtype}))"
        )
    return f"the file belongs to a model of another size: {_ONTO_ITS_BASE}"


def _check_learner_indices(path: Path, name: str, idx: Tensor, n_nodes: int, empty_ok: bool) -> None:
    # Empty: a group in a layer frozen whole (freeze_layers); `reconfigure_with_learners` checks which.
    ok = idx.dtype == torch.int64 and idx.dim() == 1 and (0 if empty_ok else 1) <= idx.numel() <= n_nodes
    if ok and idx.numel():
        ok = bool(idx[0] >= 0) and bool(idx[-1] < n_nodes) and bool((idx[1:] > idx[:-1]).all())
    if not ok:
        raise LearnersFileError(
            f"{str(path)!r}: {name}.learner_indices must be sorted distinct int64 node indices in [0, {n_nodes})"
        )


def _check_against_model(
    path: Path,
    model: nn.Module,
    metadata: Mapping[str, str],
    tensors: Mapping[str, Tensor],
    spec: FFNSpec | None,
    active: ActiveLearners | None,
    digests: DigestCache,
) -> tuple[FARConfig, dict[str, Tensor], list[str], dict[str, NodeGroup]]:
    config, layout = _parse(path, metadata)
    relayout = active is not None and active.relayout  # another user's file split it: it may be re-split
    loaded = get_config(model) if relayout else None
    if loaded is not None and (loaded.attention_retention is None) != (config.attention_retention is None):
        raise LearnersFileError(
            f"{str(path)!r} splits attention heads {'not ' if config.attention_retention is None else ''}as the "
            f"loaded file {active.path!r} does; call far.saving.unload_learners(model) first, then load it"
        )
    if metadata["model_type"] != str(model_type(model)):
        raise LearnersFileError(
            f"{str(path)!r} was saved from a {metadata['model_type']!r} model, this model is "
            f"{model_type(model)!r}: {_ONTO_ITS_BASE}"
        )
    ffns = node_groups(model, spec, attention=config.attention_retention is not None)
    if layout != {ffn.name: list(ffn.inputs) for ffn in ffns.values()}:
        raise LearnersFileError(
            f"{str(path)!r} describes other FFNs ({len(layout)}, e.g. {next(iter(layout), None)!r}) than this "
            f"model has ({len(ffns)}, e.g. {next(iter(ffns))!r}): it belongs to another architecture; {_ONTO_ITS_BASE}"
        )
    chosen, ffn_keys = {}, set()
    for ffn in ffns.values():
        idx = tensors.get(f"{ffn.name}.learner_indices", torch.empty(0))
        _check_learner_indices(path, ffn.name, idx, ffn.n_nodes, config.freeze_layers is not None)
        chosen[ffn.name] = idx
        k = idx.numel()
        ffn_keys.add(f"{ffn.name}.learner_indices")
        for name in (*ffn.inputs, ffn.output):
            module = model.get_submodule(name)
            (out_f, in_f), dtype, has_bias = _linear_shape(module)
            rows = k * projection_rows(module, INPUT if name in ffn.inputs else OUTPUT) // ffn.n_nodes
            shape = (rows, in_f) if name in ffn.inputs else (out_f, rows)
            _expect(path, tensors, f"{name}.learner_weight", shape, dtype)
            ffn_keys.add(f"{name}.learner_weight")
            if name in ffn.inputs and has_bias:
                _expect(path, tensors, f"{name}.learner_bias", (rows,), dtype)
                ffn_keys.add(f"{name}.learner_bias")
    # Every other tensor overwrites a whole parameter; inside an FFN only the output bias may be
    # overwritten, which belongs to no node (a whole FFN weight would overwrite frozen nodes).
    projections = {name for ffn in ffns.values() for name in (*ffn.inputs, ffn.output)}
    params = {
        name: p
        for name, p in model.named_parameters()
        if name.rpartition(".")[0] not in projections or name in {f"{f.output}.bias" for f in ffns.values()}
    }
    others = sorted(set(tensors) - ffn_keys)
    head_size = getattr(getattr(model, "config", None), "num_labels", None)
    for name in others:
        if name not in params:
            raise LearnersFileError(
                f"{str(path)!r} holds {name!r}, which is not a parameter of this model that a learners file "
                f"may overwrite; it belongs to another model: {_ONTO_ITS_BASE}"
            )
        _expect(path, tensors, name, tuple(params[name].shape), params[name].dtype, head_size=head_size)
    if is_reconfigured(model) and not relayout:
        if not _same_layout(model, config, chosen, spec):
            raise LearnersFileError(
                f"this model is reconfigured differently from the one {str(path)!r} was saved from; "
                "load the file onto the plain base model (far.restore(model) first)"
            )
    # With a file loaded, the base is the model with that file's overwritten values put back.
    base_values = None if active is None else active.base
    version = _READABLE[metadata["format_version"]]
    fingerprint = base_fingerprint(
        model, ffns, chosen, others, base_values=base_values, version=version, digests=digests
    )
    if fingerprint != metadata["base_fingerprint"]:
        raise LearnersFileError(
            f"{str(path)!r} was trained from a different base model: the model's frozen weights do not match the "
            "fingerprint in the file. Load it onto the exact base model (same checkpoint and dtype) it came from "
            "(far predict: --model BASE): the stock pretrained model for a file saved after far.finetune or far "
            "train (frozen values reset), the primed model itself for one saved with reset_frozen=False (far train "
            "--keep-primed-frozen), which only that run's saved model folder holds: predict with "
            "far predict --model RUN/model, without --learners"
        )
    return config, chosen, others, ffns


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
    """Record the node-row digests of the base values where the swap moved them: the frozen rows in
    the new layout, and the copies of the learner rows' base values. The swap only moved base rows
    (and kept copies), so these are exactly their digests; nothing is hashed again."""
    for name, module in modules.items():
        order, k = module.node_order.cpu().numpy(), module.n_learners  # stored position -> original row
        for part, table in tables.get(name, {}).items():
            learners, frozen = f"{name}.learner_{part}", getattr(module, f"frozen_{part}")
            active.digests.put_rows(as_rows(active.base[learners]), table[order[:k]])
            active.digests.put_rows(as_rows(frozen.detach()), table[order[k:]])


def _same_layout(model: nn.Module, config: FARConfig, chosen: Mapping[str, Tensor], spec: FFNSpec | None) -> bool:
    current = learners(model, spec)
    return get_config(model) == config and all(torch.equal(current[n].cpu(), chosen[n]) for n in chosen)


@torch.no_grad()
def load_learners(model: nn.Module, path: str | os.PathLike, *, spec: FFNSpec | None = None) -> nn.Module:
    """Apply a file written by `far.save_learners` to its base model, in place.

    A plain base model is reconfigured with the recorded learners first; a model already
    reconfigured with the same learners and config is updated as it is. On a model that holds
    another file (another user's), that file's changes are undone first, so the model then
    computes exactly what base + this file computes, whatever learners either file has. The
    model keeps a copy of the base values this file overwrites (the size of the file's tensors)
    for that; `far.saving.unload_learners` gives the base back. The head's labels and problem type
    the file records go on `model.config` too (the base's come back with it).

    Everything is checked before the model is touched: the file's own sha256, its format version,
    the model type, the FFN layout, every shape and dtype, and the fingerprint of the base weights.
    A file that fails any check raises and leaves the model (and the file it holds) as it was.

    Swapping users is made cheap without skipping a check: the model keeps the digests of its base
    values (rehashed only where a tensor was written since, see `far.saving.digests`) and the
    identity of the files it verified (an unchanged file is not hashed again), and when only the
    learners differ, each projection's rows move within its own storage (`far.surgery.reconfigure.resplit`).

    Args:
        model: The base model the file was trained from (plain, reconfigured the same way, or
            holding another file for the same base).
        path: A learners file.
        spec: FFN layout for architectures that are not built in.

    Returns:
        The same model object, now equal to the model that was saved.

    Raises:
        LearnersFileError (a ValueError): the file is corrupted, truncated, not a FAR learners
            file, of an unknown version, or belongs to another architecture or base model, or to one
            with a head of another size (the message gives both sizes) or another dtype.

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
    metadata, tensors = _read(path, verified)
    config, chosen, others, groups = _check_against_model(path, model, metadata, tensors, spec, active, digests)
    labels = _recorded_config(path, metadata)  # what the file says of its head: its labels, for model.config
    # The base's node-row digests, original order: the check just read them (a version-2 file).
    tables = _node_tables(model, groups, active, digests) if metadata["format_version"] != "1" else {}
    # Everything is verified; from here on nothing raises on bad input.
    relayout = not is_reconfigured(model)
    if active is not None:
        revert(model, active)  # the base values again, in the active file's layout
        relayout = active.relayout
        if not _same_layout(model, config, chosen, spec) and not resplit(model, chosen, config, spec=spec):
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
        content_sha256=metadata[_CONTENT_KEY],
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
