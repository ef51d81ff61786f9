"""A layer run without keeping its activations, run again in backward: the lean runtimes' layer checkpointing.

>>> h = Recompute.apply(layer, h)         # (B, T, hidden): only `h` is kept for backward
>>> h = Recompute.apply(layer, h, mask)   # the layer's other arguments are passed on, both times
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Recompute(torch.autograd.Function):
    """Run `layer(h, *args)` keeping only `h`; run it again in backward with the same RNG state (dropout).

    torch.utils.checkpoint does the same, but its first call imports torch._dynamo and sympy
    (docs/design.md, "Resident memory"), which a memory-bound process cannot spend.
    """

    @staticmethod
    def forward(ctx, layer: nn.Module, h: Tensor, *args: object) -> Tensor:
        ctx.layer, ctx.args, ctx.rng = layer, args, torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(h.device) if h.is_cuda else None
        ctx.save_for_backward(h)
        return layer(h, *args)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        (h,) = ctx.saved_tensors
        h = h.detach().requires_grad_(ctx.needs_input_grad[1])
        with torch.random.fork_rng(devices=[h.device] if h.is_cuda else []), torch.enable_grad():
            torch.set_rng_state(ctx.rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, h.device)
            out = ctx.layer(h, *ctx.args)
            # d/d(out) of sum(out * grad) is grad, exactly. torch.autograd.backward(out, grad) would do the same,
            # but an explicit gradient makes it import torch.fx's symbolic shapes, and with them sympy.
            (out * grad).sum().backward()
        return (None, h.grad, *(None for _ in ctx.args))
