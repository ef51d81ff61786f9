"""`Scratch`: the noise buffer MeZO works in, allocated once and reused by every chunk of every step.

MeZO regenerates its random direction z chunk by chunk into one small buffer per (dtype, device).
A fresh tensor per chunk would leave many small blocks scattered through the allocator's heap
while the forward pass runs; its activations then cannot reuse the holes between them, and the
process's peak RSS creeps up step after step. One fixed buffer does not.

The chunk is small on purpose: below PyTorch's intra-op grain size (32,768 elements) every
elementwise op on it runs on the calling thread. Larger chunks make each `add_` an OpenMP parallel
region, and on a small, shared CPU waking the other threads for a few microseconds of work costs
more than the work: several times as much in all (docs/design.md, "MeZO"). Chunks of 64 KB also
stay in L2 between being generated and being added to the weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 1 << 14  # elements per piece: 64 KB of fp32, under the intra-op grain size (see above)


class Scratch:
    """The (chunk,) buffer z is drawn into, for the weights of one dtype on one device."""

    def __init__(self, dtype: torch.dtype, device: torch.device, chunk: int) -> None:
        self.z: Tensor = torch.empty(chunk, dtype=dtype, device=device)

    @property
    def chunk(self) -> int:
        return self.z.numel()


def scratch_for(
    params: list[Tensor], have: dict[tuple[torch.dtype, torch.device], Scratch]
) -> dict[tuple[torch.dtype, torch.device], Scratch]:
    """Scratch per (dtype, device) of `params`, reusing those in `have` that are big enough."""
    needs: dict[tuple[torch.dtype, torch.device], int] = {}
    for p in params:
        key = (p.dtype, p.device)
        needs[key] = max(needs.get(key, 0), min(CHUNK, p.numel()))
    result = {}
    for (dtype, device), chunk in needs.items():
        old = have.get((dtype, device))
        result[(dtype, device)] = old if old is not None and old.chunk >= chunk else Scratch(dtype, device, chunk)
    return result
