"""Matrix-product FLOPs of a training step, counted from a model's shapes.

The *FLOP-bound ratio* of a configuration is its count divided by full fine-tuning's: the speed-up
FAR could reach if a step cost nothing but its matrix products. What it leaves out (optimizer,
embeddings, norms, activations, memory traffic) is why a measured ratio sits above it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from far.layers import PROJECTION_TYPES, SplitLinear


@dataclass(frozen=True)
class StepFlops:
    forward: int
    input_grad: int
    weight_grad: int

    @property
    def total(self) -> int:
        return self.forward + self.input_grad + self.weight_grad


def _weights(module: nn.Module) -> tuple[int, int]:
    """(all weight elements, trainable weight elements) of a projection."""
    if isinstance(module, SplitLinear):
        learn, frozen = module.learner_weight, module.frozen_weight
        return learn.numel() + frozen.numel(), learn.numel() if learn.requires_grad else 0
    weight = module.weight
    return weight.numel(), weight.numel() if weight.requires_grad else 0


def step_flops(model: nn.Module, batch_size: int, seq_len: int) -> StepFlops:
    """FLOPs (2 per multiply-add) of one training step's matrix products.

    Counts every linear projection (forward, gradient of its input, gradient of its trainable
    weights; a split layer, FFN or attention, only for its learners) and attention's two batched products per
    layer (QK^T and AV; both operands need gradients). Every layer's input is taken to need a
    gradient, true whenever anything below it trains (e.g. the embedding LayerNorm).
    """
    tokens = batch_size * seq_len
    forward = input_grad = weight_grad = 0
    for module in model.modules():
        if isinstance(module, (*PROJECTION_TYPES, SplitLinear)):
            total, trainable = _weights(module)
            forward += 2 * tokens * total
            input_grad += 2 * tokens * total
            weight_grad += 2 * tokens * trainable
    config = model.config
    attention = 2 * 2 * batch_size * seq_len * seq_len * config.hidden_size * config.num_hidden_layers
    return StepFlops(forward=forward + attention, input_grad=input_grad + 2 * attention, weight_grad=weight_grad)
