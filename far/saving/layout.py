"""A saved FAR layout rebuilt on a plain model: the one path from saved tensors back to split layers.

A reconfigured model's tensors record its layout (each split FFN's `node_order` and learner
block). FAR checkpoints (`far.from_pretrained`), `far.finetune` checkpoints and Trainer checkpoints
under `far.FARCallback` all come back through `rebuild_layout`, which reads the learners with
`far.surgery.reconfigure.learners_from_state_dict` and splits the model with `reconfigure_with_learners`, so
that the model can then load the saved weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch
from safetensors import safe_open
from torch import Tensor, nn

from far.architectures import FFNSpec, find_attention, find_ffns
from far.config import FARConfig
from far.freezing import find_layers, layer_index
from far.selection import learner_count
from far.surgery.reconfigure import reconfigure_with_learners
from far.surgery.state import is_reconfigured, learners, learners_from_state_dict

# The tensors of a state dict that say which nodes are learners (the rest are weights).
LAYOUT_SUFFIXES = (".node_order", ".learner_weight")


def read_layout(files: Iterable[str | os.PathLike]) -> dict[str, Tensor]:
    """The tensors of safetensors files that record a FAR layout (node orders, learner blocks)."""
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if k.endswith(LAYOUT_SUFFIXES)})
    return tensors


def inferred_config(model: nn.Module, chosen: Mapping[str, Tensor], spec: FFNSpec | None = None) -> FARConfig:
    """A `FARConfig` for learners saved without one: the overall retention, and the selection it fits.

    Only retention, the frozen bottom layers (FFNs with no learners) and attention retention (where
    heads are split) can be read back from a layout; seed and freeze_embeddings take their defaults.
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
        model: A plain model of the saved architecture, or one already split the same way (it is
            then left as it is).
        tensors: The saved state dict, or at least its layout tensors (`read_layout`).
        config: The `FARConfig` to record on the model; None infers it (`inferred_config`).
        spec: FFN layout for architectures that are not built in.

    Returns:
        The same model object.

    Raises:
        ValueError: the tensors hold no layout for one of the model's FFNs, or the model is
            already split with other learners.
    """
    wanted = learners_from_state_dict(model, tensors, spec)
    if is_reconfigured(model):
        have = learners(model, spec)
        if have.keys() != wanted.keys() or any(not torch.equal(have[k], wanted[k]) for k in have):
            raise ValueError("this model is reconfigured with other learners than the saved ones; pass the plain model")
        return model
    return reconfigure_with_learners(model, wanted, config or inferred_config(model, wanted, spec), spec=spec)
