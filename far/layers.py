"""`SplitLinear`: one FFN projection split into a learner sublayer and a frozen sublayer.

Nodes are stored in [learners | frozen] order. Both projections of an FFN use the same order, so
the permutation cancels between them (the activation in between is elementwise) and the FFN's
output is unchanged without any gather at run time; `node_order` maps stored position -> original
node index and is used only to merge back (`to_linear`).

The matrix products run on the two weight blocks concatenated, so the forward pass and the input
gradient cost what the original layer costs; the custom backward computes weight gradients for
the learner block only, which is where FAR saves time. Under autocast the frozen block is cast
once and cached, so each step casts only the learners (a plain layer casts all of its weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

INPUT, OUTPUT = "input", "output"


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])  # (B, T, f) -> (B*T, f)


def compute_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the matrix products run in: autocast's when it is on, else the weight's."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return weight.dtype


class _RowSplitLinear(torch.autograd.Function):
    """y = x @ [W_L; W_F]^T + [b_L; b_F]; weight gradients for the learner rows only.

    Frozen blocks arrive already in the compute dtype (cached, see `SplitLinear._frozen`), so
    under autocast only the learner rows are cast each step. The concatenated weight is saved
    for the backward pass instead of being rebuilt there.
    """

    @staticmethod
    def forward(ctx, x, w_learn, b_learn, w_frozen, b_frozen):
        dtype = w_frozen.dtype
        weight = torch.cat([w_learn.to(dtype), w_frozen])  # (n, d_in), learners first
        bias = None if b_learn is None else torch.cat([b_learn.to(dtype), b_frozen])
        x_c = x.to(dtype)
        ctx.save_for_backward(x_c, weight)
        ctx.k, ctx.x_dtype, ctx.has_bias = w_learn.shape[0], x.dtype, b_learn is not None
        return F.linear(x_c, weight, bias)  # (B, T, n)

    @staticmethod
    def backward(ctx, grad_y):
        x_c, weight = ctx.saved_tensors
        grad_y = grad_y.to(weight.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_y @ weight).to(ctx.x_dtype)  # (B, T, d_in)
        g_learn = _flat(grad_y)[:, : ctx.k]  # (B*T, k), a strided view: no copy
        if ctx.needs_input_grad[1]:
            grad_w = g_learn.t() @ _flat(x_c)  # (k, d_in); autograd casts it to the weight's dtype
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g_learn.sum(0)
        return grad_x, grad_w, grad_b, None, None


class _ColumnSplitLinear(torch.autograd.Function):
    """z = h @ [W_L | W_F]^T + b; weight gradients for the learner columns only."""

    @staticmethod
    def forward(ctx, h, w_learn, w_frozen, bias):
        dtype = w_frozen.dtype
        weight = torch.cat([w_learn.to(dtype), w_frozen], dim=1)  # (d_out, n)
        h_c = h.to(dtype)
        ctx.save_for_backward(h_c, weight)
        ctx.k, ctx.h_dtype, ctx.has_bias = w_learn.shape[1], h.dtype, bias is not None
        return F.linear(h_c, weight, None if bias is None else bias.to(dtype))  # (B, T, d_out)

    @staticmethod
    def backward(ctx, grad_z):
        h_c, weight = ctx.saved_tensors
        grad_z = grad_z.to(weight.dtype)
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = (grad_z @ weight).to(ctx.h_dtype)  # (B, T, n)
        if ctx.needs_input_grad[1]:
            grad_w = _flat(grad_z).t() @ _flat(h_c)[:, : ctx.k]  # (d_out, k)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_b = _flat(grad_z).sum(0)
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
        self._cast_cache: dict[str, tuple[tuple, Tensor]] = {}  # frozen tensors in a compute dtype
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

    def _frozen(self, name: str, dtype: torch.dtype) -> Tensor | None:
        """A frozen tensor in `dtype`; a cast copy is cached, since frozen values never change.

        The cache is keyed by the tensor's storage and version counter, so `load_state_dict`,
        `.to()` or any in-place write invalidates it.
        """
        tensor = getattr(self, name)
        if tensor is None or tensor.dtype == dtype:
            return tensor
        key = (dtype, tensor.data_ptr(), tensor._version)
        cached = self._cast_cache.get(name)
        if cached is None or cached[0] != key:
            cached = (key, tensor.detach().to(dtype))
            self._cast_cache[name] = cached
        return cached[1]

    def forward(self, x: Tensor) -> Tensor:
        dtype = compute_dtype(x, self.learner_weight)
        w_frozen = self._frozen("frozen_weight", dtype)
        needs_graph = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        if self.role == INPUT:
            b_frozen = self._frozen("frozen_bias", dtype)
            if needs_graph:
                return _RowSplitLinear.apply(x, self.learner_weight, self.learner_bias, w_frozen, b_frozen)
            weight = torch.cat([self.learner_weight.to(dtype), w_frozen])
            bias = None if b_frozen is None else torch.cat([self.learner_bias.to(dtype), b_frozen])
            return F.linear(x.to(dtype), weight, bias)
        if needs_graph:
            return _ColumnSplitLinear.apply(x, self.learner_weight, w_frozen, self.bias)
        weight = torch.cat([self.learner_weight.to(dtype), w_frozen], dim=1)
        return F.linear(x.to(dtype), weight, None if self.bias is None else self.bias.to(dtype))

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
