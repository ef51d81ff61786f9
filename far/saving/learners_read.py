"""Reading a learners file and checking it against a model: everything `far.load_learners` checks before it
touches the model (the format and its version, the file's own sha256, the model type, the FFN layout, every
shape and dtype, the base fingerprint). Writing and applying a file is `far.saving.learners_file`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from far.architectures import FFNSpec, NodeGroup, model_type, projection_rows
from far.config import FARConfig
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows
from far.saving.active import ActiveLearners
from far.saving.digests import DigestCache
from far.saving.fingerprint import base_fingerprint
from far.saving.safetensors_file import read_verified, sorted_node_indices
from far.surgery.state import get_config, is_reconfigured, learners, node_groups

FORMAT = "far.learners"
FORMAT_VERSION = "2"
READABLE = {"1": 1, "2": 2}  # format version -> its base fingerprint version
# How to load a file onto the right base, from Python and from the command line.
_ONTO_ITS_BASE = "load it onto the base model it was trained from (far predict: --model BASE)"


class LearnersFileError(ValueError):
    """A learners file that cannot be applied: corrupted, truncated, foreign or for another base."""


def check_format(path: Path, metadata: Mapping[str, str]) -> None:
    """Raise unless the metadata says a learners file of a version this far reads."""
    if metadata.get("format") != FORMAT:
        raise LearnersFileError(
            f"{str(path)!r} has no FAR learners metadata (format={metadata.get('format')!r}); "
            "only files written by far.save_learners can be loaded"
        )
    if metadata.get("format_version") not in READABLE:
        raise LearnersFileError(
            f"{str(path)!r} is a learners file of format version {metadata.get('format_version')!r}, "
            f"this version of far reads versions {' and '.join(READABLE)}; upgrade far or re-export the file"
        )


def read_learners(path: Path, verified: dict[tuple, str] | None = None) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensors of a learners file, verified (`read_verified`) before anything is used."""
    return read_verified(
        path, check_format, LearnersFileError, writer="far.save_learners(model, path)", verified=verified
    )


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
    """Raise unless the file's `key` has `shape` and `dtype`; `head_size` (the model's labels) for a whole parameter."""
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
    """The cause of a tensor that does not fit, and what to do."""
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


def check_against_model(
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
        # Empty: a group in a layer frozen whole (freeze_layers); `reconfigure_with_learners` checks which.
        if not sorted_node_indices(idx, ffn.n_nodes, empty_ok=config.freeze_layers is not None):
            raise LearnersFileError(
                f"{str(path)!r}: {ffn.name}.learner_indices must be sorted distinct int64 node indices in "
                f"[0, {ffn.n_nodes})"
            )
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
        if not same_layout(model, config, chosen, spec):
            raise LearnersFileError(
                f"this model is reconfigured differently from the one {str(path)!r} was saved from; "
                "load the file onto the plain base model (far.restore(model) first)"
            )
    # With a file loaded, the base is the model with that file's overwritten values put back.
    base_values = None if active is None else active.base
    version = READABLE[metadata["format_version"]]
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


def same_layout(model: nn.Module, config: FARConfig, chosen: Mapping[str, Tensor], spec: FFNSpec | None) -> bool:
    current = learners(model, spec)
    return get_config(model) == config and all(torch.equal(current[n].cpu(), chosen[n]) for n in chosen)
