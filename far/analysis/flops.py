"""Matrix-product FLOPs of a training step, counted from a model's shapes.

The *FLOP-bound ratio* of a configuration is its count divided by full fine-tuning's: the speed-up
FAR could reach if a step cost nothing but its matrix products. What it leaves out (optimizer,
embeddings, norms, activations, memory traffic) is why a measured ratio sits above it; `far.analysis.roofline`
adds those bytes.

Backward has a depth: autograd computes a product's input gradient only where something below it
needs a gradient. With the embeddings and the bottom K layers frozen, nothing below layer K is
differentiated, and in layer K itself the query, key and value projections read a layer input that
needs no gradient; `step_flops` counts that (`depth=False` counts every input gradient, as if backward
always ran to the bottom).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from far.architectures import resolve_attention_spec
from far.freezing import find_layers, frozen_depth, within
from far.layers import PROJECTION_TYPES, SplitLinear


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step's matrix products.

    `forward` and `input_grad` include attention's batched products (QK^T, AV and their gradients);
    `attention_forward` and `attention_backward` are those shares of the two, kept apart because batched
    (T, T) products run at another speed than the projections.
    """

    forward: int
    input_grad: int
    weight_grad: int
    attention_forward: int = 0
    attention_backward: int = 0

    @property
    def total(self) -> int:
        return self.forward + self.input_grad + self.weight_grad


@dataclass(frozen=True)
class BackwardReach:
    """How deep backward goes: `layers` bottom first; layers below `lowest` are not differentiated at all.

    `below_trains`: something below the first layer (an embedding, the embedding LayerNorm) trains, so
    even layer `lowest` (then 0) differentiates its input. `lowest == len(layers)`: no layer is reached.
    """

    layers: tuple[str, ...]
    lowest: int
    below_trains: bool

    def layer_of(self, name: str) -> int | None:
        """Index of the layer that holds module `name`, None outside the layers (pooler, head)."""
        return next((index for index, layer in enumerate(self.layers) if within(name, [layer])), None)


def backward_reach(model: nn.Module) -> BackwardReach | None:
    """Where backward stops in `model`, from which tensors train; None if its layers cannot be found."""
    try:
        layers = find_layers(model)
    except ValueError:
        return None
    frozen, _, below_frozen = frozen_depth(model)
    return BackwardReach(tuple(layers), frozen if below_frozen else 0, not below_frozen)


def _weights(module: nn.Module) -> tuple[int, int]:
    """(all weight elements, trainable weight elements) of a projection."""
    if isinstance(module, SplitLinear):
        learn, frozen = module.learner_weight, module.frozen_weight
        return learn.numel() + frozen.numel(), learn.numel() if learn.requires_grad else 0
    weight = module.weight
    return weight.numel(), weight.numel() if weight.requires_grad else 0


def _trains(model: nn.Module, prefix: str) -> bool:
    return any(p.requires_grad for n, p in model.named_parameters() if within(n, [prefix]))


def _layer_inputs(model: nn.Module, layer: str) -> tuple[str, str, str] | None:
    """Qualified names of the projections that read a layer's input (query, key, value), if known."""
    try:
        spec = resolve_attention_spec(model)
    except ValueError:
        return None
    return f"{layer}.{spec.query}", f"{layer}.{spec.key}", f"{layer}.{spec.value}"


def step_flops(model: nn.Module, batch_size: int, seq_len: int, *, depth: bool = True) -> StepFlops:
    """FLOPs (2 per multiply-add) of one training step's matrix products.

    Counts every linear projection (forward, gradient of its input, gradient of its trainable
    weights; a split layer, FFN or attention, only for its learners) and attention's two batched
    products per layer (QK^T and AV), forward and backward.

    With `depth` (default), input gradients are counted only where backward reaches (see
    `backward_reach`): nothing below the lowest layer with a trainable tensor; in that layer, when
    nothing below it trains, no input gradient for query, key and value (they read the layer's input)
    and, of attention's four backward products (dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q), only
    those a trainable query, key or value needs. Without `depth`, every input gradient is counted.

    Example:
        >>> far.freeze_layers(model, 3)
        >>> step_flops(model, 8, 32).input_grad < step_flops(model, 8, 32, depth=False).input_grad
        True
    """
    tokens = batch_size * seq_len
    reach = backward_reach(model) if depth else None
    config = model.config
    n_layers = config.num_hidden_layers
    lowest = 0 if reach is None else reach.lowest
    qkv = None
    if reach is not None and not reach.below_trains and lowest < len(reach.layers):
        qkv = _layer_inputs(model, reach.layers[lowest])
    forward = input_grad = weight_grad = 0
    for name, module in model.named_modules():
        if isinstance(module, (*PROJECTION_TYPES, SplitLinear)):
            total, trainable = _weights(module)
            forward += 2 * tokens * total
            weight_grad += 2 * tokens * trainable
            index = None if reach is None else reach.layer_of(name)
            if reach is None:
                reached = True
            elif index is None:  # above the layers (pooler, head): reached if any layer or below trains
                reached = lowest < len(reach.layers)
            elif index == lowest and qkv is not None:
                reached = not within(name, qkv)
            else:
                reached = index >= lowest
            input_grad += 2 * tokens * total if reached else 0
    product = 2 * batch_size * seq_len * seq_len * config.hidden_size  # one (T, T) product per layer, all heads
    backward_products = 4 * max(n_layers - lowest, 0)
    if qkv is not None:  # the lowest layer: only what its trainable query, key or value needs
        q, k, v = (_trains(model, name) for name in qkv)
        backward_products += int(q or k) + q + k + v - 4
    attention_forward = 2 * product * n_layers
    attention_backward = product * backward_products
    return StepFlops(
        forward=forward + attention_forward,
        input_grad=input_grad + attention_backward,
        weight_grad=weight_grad,
        attention_forward=attention_forward,
        attention_backward=attention_backward,
    )
