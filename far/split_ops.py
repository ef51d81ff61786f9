"""The autograd functions of a split FFN projection: full products, learner-only weight gradients.

Shapes: T tokens (batch x length, flattened), n nodes of which the first k are learners, f the
projection's other side (d_in for an input projection, d_out for the output projection).

- `RowSplitFn`, the input projection: y = x @ W^T + b with W (n, d_in). Backward keeps x (as a
  plain nn.Linear does) and computes the weight gradient of the first k rows only.
- `ColumnSplitFn`, the output projection: z = h @ W + b with W (n, d_out) stored nodes-first.
  Backward keeps only what the learners' weight gradient needs: h[:, :k] (a copy of k/n of the
  activation, so the full activation can be freed after the forward pass), or, in recompute
  mode, the tensors the activation function already keeps, from which h[:, :k] is rebuilt.

The matrix products of the forward pass and of the input gradient run on the whole weight, so
they cost what the original layer costs; the weight gradients, the only products FAR can drop,
cover the learners alone. `weight` and `weight_t` are the same matrix in the two layouts the
forward and backward products read: on a CPU without native bf16 a bf16 product is several times
slower when its right-hand operand is not in the transposed (nn.Linear) layout, so a bf16 cache
may keep both; in fp32 `weight_t` is simply a transposed view.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])  # (B, T, f) -> (B*T, f)


class RowSplitFn(torch.autograd.Function):
    """Input projection. `weight` (n, d_in) and `weight_t` (d_in, n) hold all nodes, learners first."""

    @staticmethod
    def forward(ctx, x, learner_weight, learner_bias, weight, weight_t, bias):
        x_c = x.to(weight.dtype)
        ctx.save_for_backward(x_c, weight_t)
        ctx.k, ctx.x_dtype = learner_weight.shape[0], x.dtype
        return F.linear(x_c, weight, bias)  # (B, T, n)

    @staticmethod
    def backward(ctx, grad_y):
        x_c, weight_t = ctx.saved_tensors
        grad_y = grad_y.to(weight_t.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_y @ weight_t.t()).to(ctx.x_dtype)  # (B, T, d_in)
        g_learn = _flat(grad_y)[:, : ctx.k]  # (T, k), a strided view: no copy
        if ctx.needs_input_grad[1]:
            grad_w = g_learn.t() @ _flat(x_c)  # (k, d_in); autograd casts it to the parameter's dtype
        if ctx.needs_input_grad[2]:
            grad_b = g_learn.sum(0)
        return grad_x, grad_w, grad_b, None, None, None


class ColumnSplitFn(torch.autograd.Function):
    """Output projection. `weight` (d_out, n) and `weight_t` (n, d_out) hold all nodes, learners first.

    `rebuild`, when given, recomputes the learners' activation h[..., :k] from `sources` (tensors
    that the activation function keeps for its own backward anyway) instead of keeping a copy.
    """

    @staticmethod
    def forward(ctx, h, learner_weight, weight, weight_t, bias, rebuild, *sources):
        dtype = weight.dtype
        k = learner_weight.shape[0]
        ctx.k, ctx.h_dtype, ctx.rebuild = k, h.dtype, rebuild
        if not ctx.needs_input_grad[1]:
            kept: tuple[Tensor, ...] = ()
        elif rebuild is not None:
            kept = sources
        else:
            kept = (h[..., :k].to(dtype, copy=True),)  # (B, T, k): lets the full activation be freed
        ctx.save_for_backward(weight_t, *kept)
        ctx.n_sources = len(sources)
        return F.linear(h.to(dtype), weight, None if bias is None else bias.to(dtype))  # (B, T, d_out)

    @staticmethod
    def backward(ctx, grad_z):
        weight_t, *kept = ctx.saved_tensors
        grad_z = grad_z.to(weight_t.dtype)
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = (grad_z @ weight_t.t()).to(ctx.h_dtype)  # (B, T, n)
        if ctx.needs_input_grad[1]:
            h_learn = ctx.rebuild(*kept).to(weight_t.dtype) if ctx.rebuild is not None else kept[0]
            grad_w = _flat(h_learn).t() @ _flat(grad_z)  # (k, d_out)
        if ctx.needs_input_grad[4]:
            grad_b = _flat(grad_z).sum(0)
        return (grad_h, grad_w, None, None, grad_b, None) + (None,) * ctx.n_sources


def activation_rebuilder(h: Tensor, k: int, recompute: bool) -> tuple[Callable[..., Tensor], tuple[Tensor, ...]] | None:
    """How to get `h[..., :k]` back in backward from what the op that produced `h` keeps anyway.

    Recognises the activations of the built-in architectures by the autograd node that made `h`.
    ReLU keeps its output, so a view of it is free and always used. With `recompute`, also GELU
    (exact or tanh) and SiLU, which keep their input, and a gated product (act(gate) * up, Llama's
    SwiGLU), which keeps both factors: an elementwise op over k/n of the activation in backward.
    Returns None otherwise, and the caller keeps a copy of h[..., :k].
    """
    if torch.compiler.is_compiling():  # autograd nodes are not traceable; the compiled graph plans what it keeps
        return None
    node = h.grad_fn
    name = type(node).__name__ if node is not None else ""
    if name == "ReluBackward0":
        return (lambda r: r[..., :k]), (node._saved_result,)
    if not recompute:
        return None
    if name == "GeluBackward0":
        approximate = node._saved_approximate
        return (lambda a: F.gelu(a[..., :k], approximate=approximate)), (node._saved_self,)
    if name == "SiluBackward0":
        return (lambda a: F.silu(a[..., :k])), (node._saved_self,)
    if name == "MulBackward0":
        try:  # a factor that needs no gradient may not have been kept
            left, right = node._saved_self, node._saved_other
        except RuntimeError:
            return None
        if isinstance(left, Tensor) and isinstance(right, Tensor) and left.shape == right.shape == h.shape:
            return (lambda a, b: a[..., :k] * b[..., :k]), (left, right)
    return None
