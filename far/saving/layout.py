"""A saved FAR layout rebuilt on a plain model: the one path from saved tensors back to split layers.

A layout is saved in the weights (a reconfigured model's state dict: each split FFN's `node_order` and
learner block, as `far.save_pretrained` keeps it), or beside plain weights (`FARTrainer` saves the merged
model, `merged_state_dict`, which plain transformers loads, and the learner indices with the `FARConfig`
in `far_layout.safetensors`, `write_layout`). Both come back through `rebuild_from_learners`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from far.architectures import FFNSpec, find_attention, find_ffns
from far.config import FARConfig
from far.freezing import find_layers, layer_index
from far.layers import SplitLinear
from far.saving.layout_file import LAYOUT_FORMAT, LAYOUT_FORMAT_VERSION
from far.selection import learner_count
from far.storage.atomic import atomic_file
from far.surgery.reconfigure import reconfigure_with_learners
from far.surgery.state import get_config, is_reconfigured, learners, learners_from_state_dict

# The tensors of a state dict that say which nodes are learners (the rest are weights).
LAYOUT_SUFFIXES = (".node_order", ".learner_weight")
LAYOUT_FILE = "far_layout.safetensors"  # beside plain weights: learner indices and the FARConfig


def read_layout(files: Iterable[str | os.PathLike]) -> dict[str, Tensor]:
    """The tensors of safetensors files that record a FAR layout (node orders, learner blocks)."""
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if k.endswith(LAYOUT_SUFFIXES)})
    return tensors


def inferred_config(model: nn.Module, chosen: Mapping[str, Tensor], spec: FFNSpec | None = None) -> FARConfig:
    """A `FARConfig` for learners saved without one: the overall retention and the selection it fits (plus the
    frozen depth and attention retention); seed and freeze_embeddings take their defaults.
    """
    ffns = find_ffns(model, spec)
    n_nodes = {name: ffn.n_nodes for name, ffn in ffns.items()}
    retention = sum(len(chosen[n]) for n in n_nodes) / sum(n_nodes.values())
    freeze_layers = None
    if any(len(chosen[n]) == 0 for n in n_nodes):  # layers frozen whole: the lowest with learners is the depth
        layer_of = layer_index(n_nodes, find_layers(model, spec))
        freeze_layers = min(layer_of[n] for n in n_nodes if len(chosen[n]))
    trainable = [n for n in n_nodes if len(chosen[n])]
    if freeze_layers is None:
        uniform = all(len(chosen[n]) == learner_count(n_nodes[n], retention) for n in n_nodes)
    else:  # the budget in equal shares over the trainable layers, as per_layer selection spends it
        counts = [len(chosen[n]) for n in trainable]
        uniform = max(counts) - min(counts) <= 1 and len({n_nodes[n] for n in trainable}) == 1
    heads = [name for name in chosen if name not in ffns]
    attention_retention = None
    if heads:  # the fraction of heads kept, over all blocks
        blocks = find_attention(model)
        attention_retention = round(sum(len(chosen[n]) for n in heads) / sum(blocks[n].n_nodes for n in heads), 6)
    return FARConfig(
        retention=round(retention, 6),
        selection="per_layer" if uniform else "global",
        attention_retention=attention_retention,
        freeze_layers=freeze_layers,
    )


def rebuild_layout(
    model: nn.Module,
    tensors: Mapping[str, Tensor],
    config: FARConfig | None = None,
    *,
    spec: FFNSpec | None = None,
) -> nn.Module:
    """Split `model` as the saved `tensors` record, in place, ready to load them.

    Args:
        model: A plain model of the saved architecture, or one already split the same way (left as it is).
        tensors: The saved state dict, or at least its layout tensors (`read_layout`).
        config: The `FARConfig` to record on the model; None infers it (`inferred_config`).

    Raises:
        ValueError: the tensors hold no layout for one of the model's FFNs, or the model is already split
            with other learners.
    """
    wanted = learners_from_state_dict(model, tensors, spec)
    return rebuild_from_learners(model, wanted, config or inferred_config(model, wanted, spec), spec=spec)


def same_learners(model: nn.Module, wanted: Mapping[str, Tensor], spec: FFNSpec | None = None) -> bool:
    """Whether reconfigured `model` has exactly the learners `wanted` (group name -> node indices)."""
    have = learners(model, spec)
    return have.keys() == wanted.keys() and all(torch.equal(have[k], wanted[k].to(have[k].device)) for k in have)


def rebuild_from_learners(
    model: nn.Module, wanted: Mapping[str, Tensor], config: FARConfig, *, spec: FFNSpec | None = None
) -> nn.Module:
    """Split `model` with the learners `wanted`, in place; one already split so is left as it is (ValueError
    if split with other learners).
    """
    if is_reconfigured(model):
        if not same_learners(model, wanted, spec):
            raise ValueError("this model is reconfigured with other learners than the saved ones; pass the plain model")
        return model
    return reconfigure_with_learners(model, wanted, config, spec=spec)


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The state dict of `far.restore(model)` without changing `model`: each split projection's tensors become
    its plain `weight` and `bias` (one merged copy each); every other entry is the model's own tensor.
    """
    splits = {name: m for name, m in model.named_modules() if isinstance(m, SplitLinear)}
    merged: dict[str, Tensor] = {}
    for key, value in model.state_dict().items():
        owner = key.rpartition(".")[0]
        if owner not in splits:
            merged[key] = value
        elif f"{owner}.weight" not in merged:  # the module's first key: its plain tensors go here, in order
            linear = splits[owner].to_linear()
            merged[f"{owner}.weight"] = linear.weight.detach()
            if linear.bias is not None:
                merged[f"{owner}.bias"] = linear.bias.detach()
    return merged


def write_layout(model: nn.Module, folder: str | os.PathLike, *, spec: FFNSpec | None = None) -> Path:
    """Write reconfigured `model`'s layout to `folder`/far_layout.safetensors, atomically: `<group>.learner_indices`
    (k,) int64, sorted original indices, and the `FARConfig` in its metadata.
    """
    chosen = learners(model, spec)
    config = get_config(model) or inferred_config(model, chosen, spec)
    tensors = {f"{name}.learner_indices": idx.to("cpu", torch.int64).contiguous() for name, idx in chosen.items()}
    metadata = {
        "format": LAYOUT_FORMAT,
        "format_version": LAYOUT_FORMAT_VERSION,
        "far_config": json.dumps(config.to_dict(), sort_keys=True),
    }
    path = Path(folder) / LAYOUT_FILE
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return path


def read_layout_file(folder: str | os.PathLike) -> tuple[dict[str, Tensor], FARConfig] | None:
    """The learners and `FARConfig` of `folder`/far_layout.safetensors; None where there is no such file."""
    path = Path(folder) / LAYOUT_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as error:  # SafetensorError and OSError alike: the file is unreadable
        raise ValueError(f"{str(path)!r} is not a readable safetensors file (truncated?): {error}") from error
    if metadata.get("format") != LAYOUT_FORMAT or metadata.get("format_version") != LAYOUT_FORMAT_VERSION:
        raise ValueError(
            f"{str(path)!r} is not a FAR layout file of format version {LAYOUT_FORMAT_VERSION} (format="
            f"{metadata.get('format')!r}, version {metadata.get('format_version')!r}); save the folder again"
        )
    try:
        config = FARConfig(**json.loads(metadata["far_config"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{str(path)!r}: the recorded FARConfig is invalid: {error}") from error
    suffix = ".learner_indices"
    return {key.removesuffix(suffix): idx for key, idx in tensors.items() if key.endswith(suffix)}, config
