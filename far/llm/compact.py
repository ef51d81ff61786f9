"""Weights stored compactly and read in fp32: the storage of the lean runtime (`far.llm.lean_model`).

A `CompactWeight` keeps bf16 (or fp32) and is read as an fp32 temporary as each layer runs: a bf16
matrix product is many times slower on CPUs without AVX-512 BF16 (docs/design.md, "Resident memory").
While a `Perturbation` is set, a trainable weight is read as `stored + scale * z`: the stored weight is
never perturbed, so nothing drifts (in-place +εz, -2εz, +εz changes about half of a bf16 model's weights).
The update `stored += delta * z` rounds stochastically in bf16: round-to-nearest would drop most of
MeZO's updates (lr * g ~ 1e-5 against bf16's 2^-8 spacing). A frozen embedding can stay as GGUF Q8_0
blocks (`Q8Embedding`, 1.06 bytes a weight), dequantised only for the rows a batch uses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from far.seeds import derive_seed

Q8_BLOCK, Q8_BYTES = 32, 34  # GGUF Q8_0: an fp16 scale and 32 int8 values per block


class Perturbation:
    """The random direction trainable weights are read at: `stored + scale * z(seed, index)`, shared by a
    model's weights (`scale` 0: none); `active` limits it to those weight indices (layer-sparse MeZO).
    """

    def __init__(self) -> None:
        self.seed = 0
        self.scale = 0.0
        self.active: frozenset[int] | None = None

    def set(self, seed: int, scale: float, active: frozenset[int] | None = None) -> None:
        self.seed, self.scale, self.active = int(seed), float(scale), active

    def clear(self) -> None:
        self.scale = 0.0
        self.active = None

    def covers(self, index: int) -> bool:
        return self.active is None or index in self.active

    def generator(self, seed: int, index: int, salt: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(seed, index, salt))

    def direction(self, seed: int, index: int, shape: torch.Size) -> Tensor:
        """z of weight `index` for `seed`: fp32 standard normal, the same every time it is drawn."""
        return torch.randn(shape, generator=self.generator(seed, index))


def stochastic_round_bf16(x: Tensor, generator: torch.Generator) -> Tensor:
    """`x` (fp32) to bf16, rounding up with probability equal to the dropped fraction (unbiased)."""
    bits = x.contiguous().view(torch.int32)
    # Adding uniform noise below the kept 16 bits, then truncating, rounds the magnitude up with
    # probability (dropped bits) / 2^16; the sign bit is untouched, so negatives round the same way.
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


class CompactWeight(nn.Module):
    """One weight tensor in a storage dtype (bf16 or fp32), read in fp32, perturbed on read while trainable."""

    def __init__(self, tensor: Tensor, dtype: torch.dtype, trainable: bool, perturbation: Perturbation) -> None:
        super().__init__()
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"a CompactWeight is stored in bfloat16 or float32, not {dtype}")
        self.stored = nn.Parameter(tensor.detach().to(dtype, copy=True).contiguous(), requires_grad=False)
        self.trainable = bool(trainable)
        self.index = 0  # set by the model: which generator seed its direction comes from
        self.perturbation = perturbation

    def value(self) -> Tensor:
        """The weight in fp32, `+ scale * z` while perturbed; never a view of the storage."""
        p = self.perturbation
        if self.trainable and p.scale and p.covers(self.index):
            z = p.direction(p.seed, self.index, self.stored.shape)
            return z.mul_(p.scale).add_(self.stored)
        return self.stored.float() if self.stored.dtype != torch.float32 else self.stored.clone()

    @torch.no_grad()
    def update(self, seed: int, step: float) -> None:
        """`stored += step * z(seed)`, stochastically rounded when stored in bf16."""
        z = self.perturbation.direction(seed, self.index, self.stored.shape)
        if self.stored.dtype == torch.float32:
            self.stored.add_(z, alpha=step)
            return
        moved = z.mul_(step).add_(self.stored)
        self.stored.copy_(stochastic_round_bf16(moved, self.perturbation.generator(seed, self.index, 1)))

    def extra_repr(self) -> str:
        return f"{tuple(self.stored.shape)}, {self.stored.dtype}, trainable={self.trainable}"


class _LinearFn(torch.autograd.Function):
    """y = x W^T keeping only x for backward and rebuilding W there; W's gradient goes to the layer's
    `grad_sink` (if any) and is never returned.
    """

    @staticmethod
    def forward(ctx, x: Tensor, layer: CompactLinear) -> Tensor:
        ctx.save_for_backward(x)
        ctx.layer = layer
        return F.linear(x, layer.weight_value())

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        # The input's gradient first: a sink may update the weight in place (AdamW stepping in backward).
        grad_input = grad @ layer.weight_value()
        if layer.grad_sink is not None:
            layer.grad_sink(grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1]))  # (out, in)
        return grad_input, None


class CompactLinear(nn.Module):
    """A bias-free linear layer of one or more `CompactWeight` blocks, concatenated along `node_dim` (0: an
    FFN input projection's rows, 1: the output projection's columns) into the fp32 temporary it multiplies by.
    """

    def __init__(self, parts: list[CompactWeight], node_dim: int = 0) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.node_dim = node_dim
        self.grad_sink: Callable[[Tensor], None] | None = None

    def weight_value(self) -> Tensor:
        if len(self.parts) == 1:
            return self.parts[0].value()
        return torch.cat([p.value() for p in self.parts], dim=self.node_dim)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _LinearFn.apply(x, self)
        return F.linear(x, self.weight_value())


class Q8Embedding(nn.Module):
    """A frozen embedding kept as GGUF Q8_0 blocks ((vocab, hidden / 32 * 34) uint8); `rows(ids)` dequantises
    only the rows asked for.
    """

    def __init__(self, blocks: Tensor, hidden_size: int) -> None:
        super().__init__()
        if hidden_size % Q8_BLOCK or blocks.shape[1] != hidden_size // Q8_BLOCK * Q8_BYTES:
            raise ValueError(f"Q8_0 rows of {hidden_size} values take {hidden_size // Q8_BLOCK * Q8_BYTES} bytes")
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.hidden_size = hidden_size

    def rows(self, ids: Tensor) -> Tensor:
        """fp32 rows of `ids`: shape `ids.shape + (hidden,)`."""
        raw = self.blocks[ids.reshape(-1)].view(-1, self.hidden_size // Q8_BLOCK, Q8_BYTES)
        scale = raw[..., :2].contiguous().view(torch.float16).float()  # (n, blocks, 1)
        values = raw[..., 2:].contiguous().view(torch.int8).float()  # (n, blocks, 32)
        return (scale * values).view(*ids.shape, self.hidden_size)


class DenseEmbedding(nn.Module):
    """A frozen embedding as a dense tensor (bf16 or fp32); the same `rows` as `Q8Embedding`."""

    def __init__(self, weight: Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(dtype).contiguous(), requires_grad=False)

    def rows(self, ids: Tensor) -> Tensor:
        return self.weight[ids].float()
