"""What this machine's CPU computes natively, asked once: the facts precision choices and kernels read."""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX-512 BF16 or AMX), by torch's own check."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
