"""Freezing by depth: a model's layers, found from its FFNs, and everything below them.

A layer is the FFN's parent whose name ends at its index in the stack (`bert.encoder.layer.3.output.dense`
-> `bert.encoder.layer.3`). *Below* the first layer is every `nn.Embedding` with the largest module
around it that holds no layer (BERT's `embeddings` with its LayerNorm), plus the input projections of
`far.architectures.BUILTIN_INPUT_MODULES`. With all that frozen up to layer K, backward stops at layer
K. FAR does this with `FARConfig(freeze_layers=K)`; `freeze_layers` here does it to a plain model.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence

from torch import nn

from far.architectures import FFNSpec, check_model, find_ffns, input_modules
from far.layers import SplitLinear


def find_layers(model: nn.Module, spec: FFNSpec | None = None) -> list[str]:
    """Qualified names of `model`'s layers (one FFN each), bottom first.

    Raises:
        ValueError: an FFN's name carries no layer index, two FFNs share a layer, or the FFNs sit in
            more than one stack of layers (an encoder and a decoder): depth would be ambiguous.

    Example:
        >>> find_layers(bert)[:2]
        ['bert.encoder.layer.0', 'bert.encoder.layer.1']
    """
    layers = []
    for ffn in find_ffns(model, spec).values():
        common = os.path.commonprefix([name.split(".") for name in ffn.projections])  # shared parent's parts
        indices = [i for i, part in enumerate(common) if part.isdigit()]
        if not indices:
            raise ValueError(
                f"cannot tell which layer the FFN {ffn.name!r} is in: its name carries no layer index. Freezing "
                "layers needs the FFNs inside a numbered stack of layers (e.g. model.layers.3.mlp)"
            )
        layers.append(".".join(common[: indices[-1] + 1]))
    if len(set(layers)) != len(layers):
        raise ValueError(f"more than one FFN per layer in {few_names(layers)}: cannot freeze layers by depth")
    if len({name.rpartition(".")[0] for name in layers}) != 1:
        raise ValueError(
            f"the FFNs sit in more than one stack of layers ({few_names(layers)}), e.g. an encoder and a decoder: "
            "which layers are the bottom ones is ambiguous"
        )
    return layers


def layer_index(names: Iterable[str], layers: Sequence[str]) -> dict[str, int]:
    """`{name: index of the layer that holds it}` for qualified module names (FFNs, attention blocks)."""
    result = {}
    for name in names:
        found = [i for i, layer in enumerate(layers) if name.startswith(f"{layer}.")]
        if not found:
            raise ValueError(f"{name!r} is in none of the layers {few_names(list(layers))}")
        result[name] = found[0]
    return result


def below_layers(model: nn.Module, layers: Sequence[str]) -> list[str]:
    """Names of the parameters below the first layer (the embeddings and what feeds the layers)."""
    modules = dict(model.named_modules())
    extra = input_modules(model)
    roots = []
    for name, module in modules.items():
        if within(name, layers):
            if isinstance(module, nn.Embedding):
                roots.append(name)  # an embedding inside a layer is frozen too, as freeze_embeddings does
            continue
        if isinstance(module, nn.Embedding):
            top = name
            while "." in top and not _holds_layer(top.rpartition(".")[0], layers):
                top = top.rpartition(".")[0]
            roots.append(top)
        elif name.rpartition(".")[2] in extra:
            roots.append(name)
    # named_parameters names a tied parameter once (e.g. an LM head tied to the embeddings).
    return [n for n, _ in model.named_parameters() if within(n, roots)]


def depth_parameters(model: nn.Module, layers: Sequence[str], k: int) -> list[str]:
    """Names of the parameters below the first layer and in the bottom `k` layers, in model order."""
    below = set(below_layers(model, layers))
    return [n for n, _ in model.named_parameters() if n in below or within(n, layers[:k])]


def frozen_depth(model: nn.Module, spec: FFNSpec | None = None) -> tuple[int, int, bool]:
    """(bottom layers frozen whole, all layers, whether everything below them is frozen too)."""
    layers = find_layers(model, spec)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    k = next((i for i, layer in enumerate(layers) if any(within(n, [layer]) for n in trainable)), len(layers))
    return k, len(layers), not trainable & set(below_layers(model, layers))


def check_depth(k: int, n_layers: int) -> None:
    """Raise unless `k` bottom layers of `n_layers` can be frozen and leave one layer to train."""
    if k >= n_layers:
        raise ValueError(
            f"freeze_layers={k}, but the model has {n_layers} layers and at least one must keep learners; "
            f"use freeze_layers <= {n_layers - 1} (or 'auto')"
        )


def freeze_layers(model: nn.Module, k: int, spec: FFNSpec | None = None) -> nn.Module:
    """Freeze the embeddings and the bottom `k` layers of a plain model, in place (no FAR surgery).

    `k=0` freezes only the embeddings; `k` equal to the number of layers the whole body (a linear
    probe). Only `requires_grad` changes; backward stops at layer `k`.

    Args:
        model: A plain (not reconfigured) model whose FFNs `far.find_ffns` finds.
        k: How many bottom layers to freeze whole, 0 to the number of layers.
        spec: FFN layout for architectures that are not built in.

    Returns:
        The same model object.

    Example:
        >>> far.freeze_layers(model, 2)
        >>> far.summary(model)  # ... frozen layers: 0-1 (2 of 6), backward stops at layer 2
    """
    check_model(model)
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int (the number of bottom layers to freeze), got {k!r}")
    layers = find_layers(model, spec)
    if not 0 <= k <= len(layers):
        raise ValueError(f"k must be in [0, {len(layers)}] (the model has {len(layers)} layers), got {k}")
    if any(isinstance(m, SplitLinear) for m in model.modules()):
        raise ValueError(
            "this model is reconfigured by FAR; let FAR freeze the layers (far.reconfigure(model, ..., "
            "freeze_layers=k)), or call far.restore(model) first"
        )
    for name in depth_parameters(model, layers, int(k)):
        model.get_parameter(name).requires_grad_(False)
    return model


def within(name: str, prefixes: Sequence[str]) -> bool:
    """Whether `name` is one of the modules `prefixes` or inside one."""
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


def _holds_layer(name: str, layers: Sequence[str]) -> bool:
    return name == "" or any(layer.startswith(f"{name}.") for layer in layers)


def few_names(names: list[str]) -> str:
    """The first three of `names`, and "..." when there are more."""
    return str(names[:3])[:-1] + (", ...]" if len(names) > 3 else "]")
