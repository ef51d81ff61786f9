"""`SplitLinear`: one FFN projection split into a learner sublayer and a frozen sublayer.

A projection's *nodes* are the FFN's intermediate neurons: the output rows of an input projection,
the input columns of the output projection. `SplitLinear` stores every projection node-major, one
row per node, in [learners | frozen] order, in ONE contiguous tensor: `learner_weight` (k, f) and
`frozen_weight` (n - k, f) are two views of it. So a forward pass is one plain matrix product over
the whole tensor, never a concatenation, while the optimizer sees only the learner view.

Both projections of an FFN use the same order, so the permutation cancels between them (the
activation in between is elementwise) and the FFN's output is unchanged without any gather;
`node_order` maps stored position -> original node index and is used only to merge back.

This module is the one place that knows how a projection's nodes lie in its weight (`node_rows`),
including GPT-2's `Conv1D`, which stores its weight transposed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from far.hardware import native_bf16
from far.split_ops import ColumnSplitFn, RowSplitFn, activation_rebuilder

INPUT, OUTPUT = "input", "output"
PROJECTION_TYPES = (nn.Linear, Conv1D)  # what an FFN projection may be before surgery


def node_rows(module: nn.Linear | Conv1D, role: str, weight: Tensor | None = None) -> Tensor:
    """A projection's weight as (n_nodes, features), one row per node: a view, not a copy.

    Args:
        module: An `nn.Linear` (weight (out, in)) or GPT-2 `Conv1D` (weight (in, out)).
        role: `"input"` (nodes are the outputs) or `"output"` (nodes are the inputs).
        weight: A tensor laid out like `module.weight` (e.g. its gradient); default: the weight.
    """
    if role not in (INPUT, OUTPUT):
        raise ValueError(f"role must be {INPUT!r} or {OUTPUT!r}, got {role!r}")
    weight = module.weight.detach() if weight is None else weight
    out_by_in = weight.t() if isinstance(module, Conv1D) else weight
    return out_by_in if role == INPUT else out_by_in.t()


def compute_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the matrix products run in: autocast's when it is on, else the weight's."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return weight.dtype


def _joined(first: Tensor, second: Tensor) -> Tensor | None:
    """`cat([first, second])` as a view, when the two are adjacent parts of one contiguous storage."""
    if torch.compiler.is_compiling():  # Dynamo cannot trace storage pointers; a compiled graph copies instead
        return torch.cat([first.detach(), second.detach()])
    if not (first.is_contiguous() and second.is_contiguous()) or first.dtype != second.dtype:
        return None
    if first.device != second.device or first.shape[1:] != second.shape[1:]:
        return None
    if second.numel() and (
        first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
        or second.storage_offset() != first.storage_offset() + first.numel()
    ):
        return None
    shape = (first.shape[0] + second.shape[0], *first.shape[1:])
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))  # row-major, as contiguous
    return first.detach().as_strided(shape, strides, first.storage_offset())


class SplitLinear(nn.Module):
    """An FFN projection whose nodes are split into learners (trainable) and frozen nodes.

    `learner_weight` is (k, f) and `frozen_weight` (n - k, f), nodes as rows, for both roles:
    f is `in_features` for an input projection and `out_features` for the output projection.
    An input projection's bias is split the same way (`learner_bias`, `frozen_bias`); the output
    projection's `bias` belongs to no node and keeps its original trainability.

    Build one with `from_linear` and turn it back with `to_linear`. With `recompute=True` an output
    projection keeps even less for backward (see `far.split_ops`), at the cost of recomputing the
    learners' activation.
    """

    def __init__(
        self,
        role: str,
        weight: Tensor,
        n_learners: int,
        node_order: Tensor,
        *,
        node_bias: Tensor | None = None,
        bias: nn.Parameter | None = None,
        conv1d: bool = False,
        recompute: bool = False,
    ) -> None:
        super().__init__()
        if role not in (INPUT, OUTPUT):
            raise ValueError(f"role must be {INPUT!r} or {OUTPUT!r}, got {role!r}")
        self.role = role
        self.conv1d = conv1d  # the original was GPT-2's transposed Conv1D
        self.recompute = recompute
        k = n_learners
        learn, frozen = _parts(weight, k)  # (n, f): learners' rows, then frozen rows, in one storage
        self.learner_weight = nn.Parameter(learn)
        self.frozen_weight = nn.Parameter(frozen, requires_grad=False)
        self.learner_bias = self.frozen_bias = None
        if role == INPUT and node_bias is not None:
            learn, frozen = _parts(node_bias, k)
            self.learner_bias = nn.Parameter(learn)
            self.frozen_bias = nn.Parameter(frozen, requires_grad=False)
        if role == OUTPUT:
            self.bias = bias
        self.register_buffer("node_order", node_order)  # stored position -> original node index
        self._cache: dict[str, tuple[tuple, Tensor]] = {}  # weights in a compute dtype (see _cast)
        features = weight.shape[1]
        self.in_features, self.out_features = (
            (features, weight.shape[0]) if role == INPUT else (weight.shape[0], features)
        )

    @property
    def n_nodes(self) -> int:
        return self.node_order.numel()

    @property
    def n_learners(self) -> int:
        return self.learner_weight.shape[0]

    def learner_indices(self) -> Tensor:
        """Sorted original indices of the learner nodes."""
        return self.node_order[: self.n_learners].sort().values

    @classmethod
    def from_linear(
        cls, linear: nn.Linear | Conv1D, learners: Tensor, role: str, *, recompute: bool = False
    ) -> SplitLinear:
        """Split `linear` (an `nn.Linear` or GPT-2 `Conv1D`) into `learners` and the other nodes.

        Args:
            linear: The projection to split; it is left untouched.
            learners: Sorted, unique original node indices that stay trainable.
            role: `"input"` (nodes are output rows) or `"output"` (nodes are input columns).
            recompute: Output projections only: rebuild the learners' activation in backward.
        """
        rows = node_rows(linear, role)  # (n, f)
        order = _node_order(learners, rows.shape[0], rows.device)
        node_bias = linear.bias.detach()[order] if role == INPUT and linear.bias is not None else None
        return cls(
            role,
            rows[order],  # a gather: a fresh (n, f) tensor, learners first
            learners.numel(),
            order,
            node_bias=node_bias,
            bias=linear.bias if role == OUTPUT else None,  # shared, not copied: it belongs to no node
            conv1d=isinstance(linear, Conv1D),
            recompute=recompute,
        )

    def to_linear(self) -> nn.Linear | Conv1D:
        """Merge back into the original kind of layer, nodes in their original order."""
        stored = self._rows().detach()
        rows = torch.empty_like(stored).index_copy_(0, self.node_order, stored)  # (n, f), original order
        out_by_in = rows if self.role == INPUT else rows.t()
        requires_grad = self.learner_weight.requires_grad
        if self.conv1d:
            layer = Conv1D(self.out_features, self.in_features)
            layer.weight = nn.Parameter(out_by_in.t().contiguous(), requires_grad=requires_grad)
        else:
            layer = nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
            layer.weight = nn.Parameter(out_by_in.contiguous(), requires_grad=requires_grad)
        layer.bias = self._merged_bias()
        return layer

    def _merged_bias(self) -> nn.Parameter | None:
        if self.role == OUTPUT:
            return self.bias
        if self.learner_bias is None:
            return None
        stored = torch.cat([self.learner_bias.detach(), self.frozen_bias.detach()])
        merged = torch.empty_like(stored).index_copy_(0, self.node_order, stored)
        return nn.Parameter(merged, requires_grad=self.learner_bias.requires_grad)

    def _rows(self) -> Tensor:
        """All nodes' weight rows (n, f) as one view."""
        return self._whole(self.learner_weight, self.frozen_weight)

    def _node_bias(self) -> Tensor | None:
        """An input projection's bias over all nodes (n,) as one view; None without one."""
        return None if self.learner_bias is None else self._whole(self.learner_bias, self.frozen_bias)

    def _whole(self, learners: Tensor, frozen: Tensor) -> Tensor:
        """The two parts as one tensor: a view of their storage, or a copy where they have storages of their own.

        A forward never moves the parts into one storage itself: whoever gave them their storages may write
        there again (FSDP2 gathers each parameter into a buffer of its own before every forward).
        """
        whole = _joined(learners, frozen)
        return torch.cat([learners.detach(), frozen.detach()]) if whole is None else whole

    @torch.no_grad()
    def rejoin_(self) -> None:
        """Put the learner and frozen parts back into one storage, keeping the Parameter objects (an optimizer may
        hold them); parts that share one already are left as they are.

        `.to()`, `copy.deepcopy`, `load_state_dict(assign=True)` and FSDP2's gathering give each part a storage of
        its own: the first three join them again through this method, FSDP2's callers call it
        (`far.training.sharding`).
        """
        # Out of inference mode, so the new storage can still be trained.
        with torch.inference_mode(False):
            for first, second in (("learner_weight", "frozen_weight"), ("learner_bias", "frozen_bias")):
                a, b = getattr(self, first), getattr(self, second)
                if a is not None and _joined(a, b) is None:
                    a.data, b.data = _parts(torch.cat([a.detach(), b.detach()]), a.shape[0])
        self._cache.clear()

    @torch.no_grad()
    def relayout_(self, learners: Tensor) -> None:
        """Re-split with other learners, in place: the layout `from_linear(linear, learners)` gives,
        in this module's own storage (rows permuted, the two views resized). No value changes.

        Args:
            learners: Sorted, unique original node (row) indices, as `from_linear` takes them.
        """
        self.rejoin_()  # the re-split below is done in the one storage
        order = _node_order(learners, self.n_nodes, self.node_order.device)
        position = self.node_order.argsort()  # original node -> stored position now
        source = position[order]  # new stored position -> stored position now
        k = learners.numel()
        for first, second in (("learner_weight", "frozen_weight"), ("learner_bias", "frozen_bias")):
            a, b = getattr(self, first), getattr(self, second)
            if a is None:
                continue
            whole = self._whole(a, b)  # (n, f) or (n,), a view of the one storage
            moved = whole.index_select(0, source)  # a copy, in the new order
            if k != a.shape[0]:
                a.data, b.data = _parts(whole, k)  # the same storage, split after k rows
            # Written through both parameters, so that each one's version counter records the write
            # (the frozen part's is what cached casts and digests of frozen values are keyed on).
            a.copy_(moved[:k])
            b.copy_(moved[k:])
        self.node_order.copy_(order)
        self._cache.clear()

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self.rejoin_()
        return module

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.rejoin_()  # copy.deepcopy and pickle give each part a storage of its own

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.rejoin_()  # with assign=True each part takes the storage of the tensor loaded into it

    def _cast(self, name: str, source: Tensor, learners: Tensor, dtype: torch.dtype, transpose: bool) -> Tensor:
        """`source` (all nodes, learners first along dim 0) cast to `dtype`, optionally transposed.

        Frozen values never change, so the cast is cached and reused: it is redone only when the
        frozen part was written (its version counter moves) or moved to new memory. The learners'
        part is re-cast in place whenever the learners change (every step in training).
        """
        frozen_key = (dtype, transpose, source.data_ptr(), source.device, self._frozen_version(name))
        learner_key = (learners.data_ptr(), learners._version)
        cached = self._cache.get(name)
        if cached is None or cached[0][0] != frozen_key:
            value = (source.t() if transpose else source).to(dtype, copy=True, memory_format=torch.contiguous_format)
            self._cache[name] = ((frozen_key, learner_key), value)
            return value
        value = cached[1]
        if cached[0][1] != learner_key:
            k = learners.shape[0]
            with torch.no_grad():
                (value[:, :k] if transpose else value[:k]).copy_(learners.t() if transpose else learners)
            self._cache[name] = ((frozen_key, learner_key), value)
        return value

    def _frozen_version(self, name: str) -> int:
        return (self.frozen_bias if name == "bias" else self.frozen_weight)._version

    def _weights(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor | None]:
        """(weight, weight_t, node bias) in `dtype`: weight (out_features, in_features) as F.linear
        reads it, weight_t its transpose as the input gradient reads it."""
        rows = self._rows()  # (n, f)
        bias = self._node_bias()
        if dtype != rows.dtype:
            # The forward layout always; the backward layout only where bf16 is emulated and slow
            # when it is not the transposed one (on a native CPU a view of the first suffices).
            forward_t = self.role == OUTPUT
            weight = self._cast("forward", rows, self.learner_weight, dtype, transpose=forward_t)
            if native_bf16() or not torch.is_grad_enabled():
                weight_t = weight.t()
            else:
                weight_t = self._cast("backward", rows, self.learner_weight, dtype, transpose=not forward_t)
            if bias is not None:
                bias = self._cast("bias", bias, self.learner_bias, dtype, transpose=False)
            return weight, weight_t, bias
        return (rows, rows.t(), bias) if self.role == INPUT else (rows.t(), rows, bias)

    def forward(self, x: Tensor) -> Tensor:
        dtype = compute_dtype(x, self.learner_weight)
        weight, weight_t, node_bias = self._weights(dtype)
        trainable = (self.learner_weight, self.learner_bias, self.bias if self.role == OUTPUT else None)
        needs_graph = torch.is_grad_enabled() and (
            x.requires_grad or any(p is not None and p.requires_grad for p in trainable)
        )
        if self.role == INPUT:
            if needs_graph:
                return RowSplitFn.apply(x, self.learner_weight, self.learner_bias, weight, weight_t, node_bias)
            return F.linear(x.to(dtype), weight, node_bias)  # no graph: one plain product, no copy
        if needs_graph:
            rebuild = activation_rebuilder(x, self.n_learners, self.recompute)
            rebuild_fn, sources = rebuild if rebuild is not None else (None, ())
            return ColumnSplitFn.apply(x, self.learner_weight, weight, weight_t, self.bias, rebuild_fn, *sources)
        return F.linear(x.to(dtype), weight, None if self.bias is None else self.bias.to(dtype))

    def extra_repr(self) -> str:
        return (
            f"role={self.role}, in_features={self.in_features}, out_features={self.out_features}, "
            f"learners={self.n_learners}/{self.n_nodes}" + (", recompute=True" if self.recompute else "")
        )


def _parts(whole: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`whole[:k]` and `whole[k:]` over one contiguous storage, each with a version counter of its
    own (slices would share `whole`'s), so that a learner update does not mark frozen values as
    written and invalidate their cached casts."""
    whole = whole.contiguous()
    parts = []
    for start, rows in ((0, k), (k, whole.shape[0] - k)):
        part = torch.empty(0, dtype=whole.dtype, device=whole.device)
        shape = (rows, *whole.shape[1:])
        with torch.no_grad():
            part.set_(
                whole.untyped_storage(), whole.storage_offset() + start * whole[0].numel(), shape, whole[:1].stride()
            )
        parts.append(part)
    return parts[0], parts[1]


def _node_order(learners: Tensor, n: int, device: torch.device) -> Tensor:
    """[learners | frozen] -> original node index, each part in ascending order."""
    is_learner = torch.zeros(n, dtype=torch.bool)
    is_learner[learners.cpu()] = True
    frozen = torch.arange(n)[~is_learner]
    return torch.cat([learners.cpu().sort().values, frozen]).to(device)
