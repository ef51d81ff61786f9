"""`Scratch`: the memory MeZO works in, allocated once and reused by every chunk of every step.

MeZO walks the weights chunk by chunk (z, the original values, the round trip, a mask) and keeps,
between a perturbation and its restore, a record of the elements whose round trip is inexact.
Allocating those per chunk leaves many small long-lived blocks scattered through the allocator's
heap while the forward pass runs; its activations then cannot reuse the holes between them, and
the process's peak RSS creeps up step after step (by ~130 MB on MiniLM at batch 64 x 128). A few
fixed buffers do not.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 1 << 19  # elements handled at a time: 2 MB per fp32 buffer, whatever the tensor size
RECORD_FRACTION = 32  # start with room for 1/32 of the elements (MiniLM needs ~1/44); grows if needed


class Scratch:
    """Buffers for the weights of one dtype on one device.

    Attributes:
        z, original, back: (chunk,) float buffers in the weights' dtype.
        inexact: (chunk,) bool buffer.

    Records live in two areas, one per perturbation sign, because the pass that restores from
    +εz also perturbs to −εz, reading the + records while it writes the − ones.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device, chunk: int, n_elements: int) -> None:
        self.z, self.original, self.back = (torch.empty(chunk, dtype=dtype, device=device) for _ in range(3))
        self.inexact = torch.empty(chunk, dtype=torch.bool, device=device)
        capacity = max(1024, n_elements // RECORD_FRACTION)
        self._idx = [torch.empty(capacity, dtype=torch.int32, device=device) for _ in range(2)]
        self._values = [torch.empty(capacity, dtype=dtype, device=device) for _ in range(2)]
        self._used = [0, 0]

    @property
    def chunk(self) -> int:
        return self.z.numel()

    def clear(self, sign: int) -> None:
        """Forget the records of the perturbation `sign` (+1 or -1), to write new ones."""
        self._used[sign < 0] = 0

    def record(self, sign: int, idx: Tensor, source: Tensor) -> tuple[int, int]:
        """Keep `source[idx]` and `idx` (a 1-D int64 index); returns where they are: (offset, count)."""
        area, m = sign < 0, idx.numel()
        start = self._used[area]
        if start + m > self._idx[area].numel():  # rare: grow, keeping what is recorded
            capacity = max(2 * self._idx[area].numel(), start + m)
            self._idx[area] = _grown(self._idx[area], start, capacity)
            self._values[area] = _grown(self._values[area], start, capacity)
        self._idx[area][start : start + m].copy_(idx)
        torch.index_select(source, 0, idx, out=self._values[area][start : start + m])
        self._used[area] = start + m
        return start, m

    def recorded(self, sign: int, where: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """(int64 index, values) recorded by `record(sign, ...)` at `where`."""
        area, (start, m) = sign < 0, where
        return self._idx[area][start : start + m].long(), self._values[area][start : start + m]


def _grown(t: Tensor, keep: int, capacity: int) -> Tensor:
    grown = torch.empty(capacity, dtype=t.dtype, device=t.device)
    grown[:keep] = t[:keep]
    return grown


def scratch_for(
    params: list[Tensor], have: dict[tuple[torch.dtype, torch.device], Scratch]
) -> dict[tuple[torch.dtype, torch.device], Scratch]:
    """Scratch per (dtype, device) of `params`, reusing those in `have` that are big enough."""
    needs: dict[tuple[torch.dtype, torch.device], tuple[int, int]] = {}
    for p in params:
        key = (p.dtype, p.device)
        chunk, total = needs.get(key, (0, 0))
        needs[key] = (max(chunk, min(CHUNK, p.numel())), total + p.numel())
    result = {}
    for (dtype, device), (chunk, total) in needs.items():
        old = have.get((dtype, device))
        result[(dtype, device)] = (
            old if old is not None and old.chunk >= chunk else Scratch(dtype, device, chunk, total)
        )
    return result
