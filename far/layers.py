"""`SplitLinear`: one FFN projection split into a learner sublayer and a frozen sublayer.

Nodes are stored in [learners | frozen] order. Both projections of an FFN use the same order, so
the permutation cancels between them (the activation in between is elementwise) and the FFN's
output is unchanged without any gather at run time; `node_order` maps stored position -> original
node index and is used only to merge back (`to_linear`).

The matrix products run on the two weight blocks concatenated, so the forward pass and the input
gradient cost exactly what the original layer costs; the custom backward computes weight
gradients for the learner block only, which is where FAR saves time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

INPUT, OUTPUT = "input", "output"


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])  # (B, T, f) -> (B*T, f)


class _RowSplitLinear(torch.autograd.Function):
    """y = x @ [W_L; W_F]^T + [b_L; b_F]; weight gradients for the learner rows only."""

    @staticmethod
    def forward(ctx, x, w_learn, b_learn, w_frozen, b_frozen):
        ctx.save_for_backward(x, w_learn, w_frozen)
        ctx.has_bias = b_learn is not None
        weight = torch.cat([w_learn, w_frozen])  # (n, d_in), learners first
        bias = torch.cat([b_learn, b_frozen]) if ctx.has_bias else None
        return F.linear(x, weight, bias)  # (B, T, n)

    @staticmethod
    def backward(ctx, grad_y):
        x, w_learn, w_frozen = ctx.saved_tensors
        k = w_learn.shape[0]
        dtype = grad_y.dtype  # bf16 under autocast: compute the gradients in it too
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            weight = torch.cat([w_learn, w_frozen]).to(dtype)
            grad_x = (grad_y @ weight).to(x.dtype)  # (B, T, d_in)
        g_learn = _flat(grad_y)[:, :k]  # (B*T, k), a strided view: no copy
        if ctx.needs_input_grad[1]:
            grad_w = (g_learn.t() @ _flat(x).to(dtype)).to(w_learn.dtype)  # (k, d_in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g_learn.sum(0).to(w_learn.dtype)
        return grad_x, grad_w, grad_b, None, None


class _ColumnSplitLinear(torch.autograd.Function):
    """z = h @ [W_L | W_F]^T + b; weight gradients for the learner columns only."""

    @staticmethod
    def forward(ctx, h, w_learn, w_frozen, bias):
        ctx.save_for_backward(h, w_learn, w_frozen)
        ctx.has_bias = bias is not None
        return F.linear(h, torch.cat([w_learn, w_frozen], dim=1), bias)  # (B, T, d_out)

    @staticmethod
    def backward(ctx, grad_z):
        h, w_learn, w_frozen = ctx.saved_tensors
        k = w_learn.shape[1]
        dtype = grad_z.dtype
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            weight = torch.cat([w_learn, w_frozen], dim=1).to(dtype)
            grad_h = (grad_z @ weight).to(h.dtype)  # (B, T, n)
        if ctx.needs_input_grad[1]:
            h_learn = _flat(h)[:, :k].to(dtype)  # (B*T, k)
            grad_w = (_flat(grad_z).t() @ h_learn).to(w_learn.dtype)  # (d_out, k)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_b = _flat(grad_z).sum(0).to(w_learn.dtype)
        return grad_h, grad_w, None, grad_b


class SplitLinear(nn.Module):
    """An FFN projection whose nodes are split into learners (trainable) and frozen nodes.

    For an input projection (`role="input"`) nodes are output rows: `learner_weight` is
    (k, in_features), `frozen_weight` is (n - k, in_features), and the bias is split the same way.
    For the output projection (`role="output"`) nodes are input columns: `learner_weight` is
    (out_features, k), `frozen_weight` is (out_features, n - k), and `bias` belongs to no node
    and keeps its original trainability.

    Build one with `from_linear` and turn it back with `to_linear`.
    """

    def __init__(
        self,
        role: str,
        learner_weight: Tensor,
        frozen_weight: Tensor,
        node_order: Tensor,
        *,
        learner_bias: Tensor | None = None,
        frozen_bias: Tensor | None = None,
        bias: nn.Parameter | None = None,
        conv1d: bool = False,
    ) -> None:
        super().__init__()
        if role not in (INPUT, OUTPUT):
            raise ValueError(f"role must be {INPUT!r} or {OUTPUT!r}, got {role!r}")
        self.role = role
        self.conv1d = conv1d  # the original was GPT-2's transposed Conv1D
        self.learner_weight = nn.Parameter(learner_weight)
        self.frozen_weight = nn.Parameter(frozen_weight, requires_grad=False)
        if role == INPUT:
            self.learner_bias = None if learner_bias is None else nn.Parameter(learner_bias)
            self.frozen_bias = None if frozen_bias is None else nn.Parameter(frozen_bias, requires_grad=False)
        else:
            self.bias = bias
        self.register_buffer("node_order", node_order)  # stored position -> original node index
        if role == INPUT:
            self.out_features = node_order.numel()
            self.in_features = learner_weight.shape[1]
        else:
            self.in_features = node_order.numel()
            self.out_features = learner_weight.shape[0]

    @property
    def n_nodes(self) -> int:
        return self.node_order.numel()

    @property
    def n_learners(self) -> int:
        return self.learner_weight.shape[0 if self.role == INPUT else 1]

    def learner_indices(self) -> Tensor:
        """Sorted original indices of the learner nodes."""
        return self.node_order[: self.n_learners].sort().values

    @classmethod
    def from_linear(cls, linear: nn.Linear | Conv1D, learners: Tensor, role: str) -> SplitLinear:
        """Split `linear` (an `nn.Linear` or GPT-2 `Conv1D`) into `learners` and the other nodes.

        Args:
            linear: The projection to split; it is left untouched.
            learners: Sorted, unique original node indices that stay trainable.
            role: `"input"` (nodes are output rows) or `"output"` (nodes are input columns).
        """
        conv1d = isinstance(linear, Conv1D)
        weight = linear.weight.detach()
        if conv1d:
            weight = weight.t()  # Conv1D stores (in, out); work in nn.Linear's (out, in)
        n = weight.shape[0 if role == INPUT else 1]
        node_order = _node_order(learners, n, weight.device)
        learn, frozen = node_order[: learners.numel()], node_order[learners.numel() :]
        bias = linear.bias
        if role == INPUT:
            return cls(
                role,
                weight[learn].clone(),
                weight[frozen].clone(),
                node_order,
                learner_bias=None if bias is None else bias.detach()[learn].clone(),
                frozen_bias=None if bias is None else bias.detach()[frozen].clone(),
                conv1d=conv1d,
            )
        return cls(
            role,
            weight[:, learn].contiguous(),
            weight[:, frozen].contiguous(),
            node_order,
            bias=bias,  # shared, not copied: it belongs to no node
            conv1d=conv1d,
        )

    def to_linear(self) -> nn.Linear | Conv1D:
        """Merge back into the original kind of layer, nodes in their original order."""
        dim = 0 if self.role == INPUT else 1
        stored = torch.cat([self.learner_weight.detach(), self.frozen_weight.detach()], dim=dim)
        weight = torch.empty_like(stored)
        weight.index_copy_(dim, self.node_order, stored)
        bias = self._merged_bias()
        if self.conv1d:
            layer = Conv1D(self.out_features, self.in_features)
            layer.weight = nn.Parameter(weight.t().contiguous(), requires_grad=self.learner_weight.requires_grad)
        else:
            layer = nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
            layer.weight = nn.Parameter(weight, requires_grad=self.learner_weight.requires_grad)
        layer.bias = bias
        return layer

    def _merged_bias(self) -> nn.Parameter | None:
        if self.role == OUTPUT:
            return self.bias
        if self.learner_bias is None:
            return None
        stored = torch.cat([self.learner_bias.detach(), self.frozen_bias.detach()])
        merged = torch.empty_like(stored).index_copy_(0, self.node_order, stored)
        return nn.Parameter(merged, requires_grad=self.learner_bias.requires_grad)

    def forward(self, x: Tensor) -> Tensor:
        needs_graph = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        if self.role == INPUT:
            if needs_graph:
                return _RowSplitLinear.apply(
                    x, self.learner_weight, self.learner_bias, self.frozen_weight, self.frozen_bias
                )
            bias = None if self.learner_bias is None else torch.cat([self.learner_bias, self.frozen_bias])
            return F.linear(x, torch.cat([self.learner_weight, self.frozen_weight]), bias)
        if needs_graph:
            return _ColumnSplitLinear.apply(x, self.learner_weight, self.frozen_weight, self.bias)
        return F.linear(x, torch.cat([self.learner_weight, self.frozen_weight], dim=1), self.bias)

    def extra_repr(self) -> str:
        return (
            f"role={self.role}, in_features={self.in_features}, out_features={self.out_features}, "
            f"learners={self.n_learners}/{self.n_nodes}"
        )


def _node_order(learners: Tensor, n: int, device: torch.device) -> Tensor:
    """[learners | frozen] -> original node index, each part in ascending order."""
    is_learner = torch.zeros(n, dtype=torch.bool)
    is_learner[learners.cpu()] = True
    frozen = torch.arange(n)[~is_learner]
    return torch.cat([learners.cpu().sort().values, frozen]).to(device)
