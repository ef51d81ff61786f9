"""A layout to share: what priming chose on a base and a task, for other users of that base to train with, unprimed.

`far prime` (`far.training.prime_layout`) runs only the priming phase of a FAR run and writes what it chose;
`far train/glue --layout FILE` (`far.finetune(..., layout=FILE)`) then splits a new user's model with those
learners at step 0, with no priming step: the users of one base and one task pay priming once, and share its
choice instead of each drawing their own.

The file is a `far_layout.safetensors` (`far.saving.layout`, which `read_layout_file` reads too) with more metadata:

- `<group>.learner_indices` (k,) int64: the sorted original indices of each FFN's learner nodes (an attention
  block's learner heads where the config splits heads); the bottom frozen layers' are empty;
- `far_config`: the `FARConfig` of the surgery, its `freeze_layers` resolved to the depth priming chose;
- `model_type`, `nodes` (each group's node count), `frozen_layers`, `retention` (each group's learner share);
- `base_fingerprint`: `far.saving.fingerprint.base_fingerprint` (version 2) of the plain base before priming,
  every tensor but the task head's (`head_parameters`: a new user's head is drawn anew), so that a layout for
  another base, or another architecture, is refused before anything changes;
- `record`: what primed it (task, model, configuration, seed, steps, examples), as JSON;
- `content_sha256`: the file's own digest (`far.saving.digests.content_sha256`): a flipped byte is refused.

    >>> layout = read_shared_layout("layout.safetensors")
    >>> check_layout(model, layout)          # raises, changing nothing, unless it fits this base
    >>> apply_layout(model, layout)          # the split of step 0
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from far.architectures import FFNSpec, find_ffns, model_type
from far.saving.fingerprint import FINGERPRINT_VERSION, base_fingerprint
from far.saving.layout_file import (  # noqa: F401 - the file's side, named here too
    LAYOUT_FORMAT,
    LAYOUT_FORMAT_VERSION,
    SUFFIX,
    LayoutFileError,
    SharedLayout,
    check_layout_output,
    layout_metadata,
    read_shared_layout,
)
from far.saving.safetensors_file import CONTENT_KEY, content_sha256
from far.storage.atomic import atomic_file
from far.surgery.inputs import check_learners
from far.surgery.reconfigure import reconfigure_with_learners
from far.surgery.state import STATE_ATTRIBUTE, FARState, get_config, learners, node_groups


def head_parameters(model: nn.Module) -> list[str]:
    """The parameters outside `model.base_model_prefix` (the task head, drawn anew each run); [] without a base."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or not isinstance(getattr(model, prefix, None), nn.Module):
        return []
    return [name for name, _ in model.named_parameters() if not name.startswith(f"{prefix}.")]


def backbone_fingerprint(model: nn.Module, spec: FFNSpec | None = None) -> str:
    """The base fingerprint of a plain model's every tensor but its head's: what a shared layout records."""
    ffns = find_ffns(model, spec)
    every_node = {name: torch.empty(0, dtype=torch.int64) for name in ffns}  # no learner: every row is hashed
    return base_fingerprint(model, ffns, every_node, head_parameters(model), version=FINGERPRINT_VERSION)


@torch.no_grad()
def write_shared_layout(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    base_fingerprint: str,
    record: Mapping[str, object],
    spec: FFNSpec | None = None,
) -> Path:
    """Write the layout of `model`, reconfigured at the end of priming, to `path`, atomically.

    Args:
        model: The model priming reconfigured (`far.finetune(..., stop_after_priming=True)`).
        base_fingerprint: `backbone_fingerprint` of the plain model, taken before priming moved it.
        record: What primed it (task, model, configuration, ...), kept as JSON.
    """
    config, state = get_config(model), getattr(model, STATE_ATTRIBUTE, None)
    if config is None or not isinstance(state, FARState):
        raise ValueError("write_shared_layout writes what priming chose, and this model is not reconfigured by FAR")
    chosen = learners(model, spec)
    groups = node_groups(model, spec)
    depth = state.frozen_layers
    config = dataclasses.replace(config, freeze_layers=depth if config.freeze_layers is not None else None)
    tensors = {f"{name}{SUFFIX}": idx.to("cpu", torch.int64).contiguous() for name, idx in chosen.items()}
    metadata = {
        "format": LAYOUT_FORMAT,
        "format_version": LAYOUT_FORMAT_VERSION,
        "far_config": json.dumps(config.to_dict(), sort_keys=True),
        "model_type": str(model_type(model)),
        "nodes": json.dumps({name: group.n_nodes for name, group in groups.items()}),
        "frozen_layers": str(depth),
        "retention": json.dumps({name: round(len(chosen[name]) / g.n_nodes, 4) for name, g in groups.items()}),
        "base_fingerprint": base_fingerprint,
        "fingerprint_version": str(FINGERPRINT_VERSION),
        "record": json.dumps(dict(record), sort_keys=True, default=str),
    }
    metadata[CONTENT_KEY] = content_sha256(metadata, tensors)
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def check_layout(model: nn.Module, layout: SharedLayout, spec: FFNSpec | None = None) -> None:
    """Raise `LayoutFileError`, changing nothing, unless `layout` fits plain `model`: the architecture, each
    group's node count, the learner indices and depth, and the base's fingerprint."""
    where = repr(layout.path)
    if model_type(model) != layout.metadata["model_type"]:
        raise LayoutFileError(
            f"{where} was primed on a {layout.metadata['model_type']!r} model, and this one is a "
            f"{model_type(model)!r}: prime a layout on this base (far prime --model ...)"
        )
    groups = node_groups(model, spec, attention=layout.config.attention_retention is not None)
    have = {name: group.n_nodes for name, group in groups.items()}
    if have != layout.nodes:
        wrong = sorted(set(have.items()) ^ set(layout.nodes.items()))[:4]
        raise LayoutFileError(
            f"{where} does not fit this model's shape: its node groups (name, nodes) differ at {wrong}; prime a "
            "layout on this base (far prime --model ...)"
        )
    try:
        check_learners(layout.learners, groups, empty_ok=layout.config.freeze_layers is not None)
    except ValueError as error:
        raise LayoutFileError(f"{where} holds learners that do not fit this model: {error}") from error
    if backbone_fingerprint(model, spec) != layout.base_fingerprint:
        raise LayoutFileError(
            f"{where} was primed on another base: this model's weights do not match the base fingerprint it "
            "records. Train with the base it was primed on, or prime a layout on this one (far prime --model ...)"
        )


def apply_layout(model: nn.Module, layout: SharedLayout, spec: FFNSpec | None = None) -> nn.Module:
    """Split plain `model` as `layout` says, in place: the surgery at step 0 of a run trained with it."""
    return reconfigure_with_learners(model, layout.learners, layout.config, spec=spec)
