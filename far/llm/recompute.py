"""A layer run without keeping its activations, run again in backward: the lean runtime's layer checkpointing.

>>> h = Recompute.apply(layer, h)   # (B, T, hidden): only `h` is kept for backward
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Recompute(torch.autograd.Function):
    """Run a layer without keeping its activations; run it again in backward to get its gradients.

    torch.utils.checkpoint does the same, but its first call imports torch._dynamo and sympy
    (docs/design.md, "Resident memory"), which a memory-bound process cannot spend.
    """

    @staticmethod
    def forward(ctx, layer: nn.Module, h: Tensor) -> Tensor:
        ctx.layer = layer
        ctx.save_for_backward(h)
        return layer(h)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:
        (h,) = ctx.saved_tensors
        h = h.detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.layer(h)
            # (out * grad).sum() gives the same gradients as torch.autograd.backward(out, grad), which on
            # its first call imports torch's symbolic shapes and sympy in torch 2.13
            # (docs/design.md, "Resident memory").
            (out * grad).sum().backward()
        return None, h.grad
