"""Seeds derived from a base seed and counters, so that no random state has to be stored."""

from __future__ import annotations

_MASK = (1 << 64) - 1


def derive_seed(*values: int) -> int:
    """A well-mixed 63-bit seed from integers (SplitMix64 applied to each in turn).

    Nearby inputs ((seed, step) and (seed, step + 1)) give unrelated seeds, unlike `seed + step`,
    and the result depends on the order of the values.
    """
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (int(value) & _MASK)) & _MASK
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        state = z ^ (z >> 31)
    return state >> 1  # torch.Generator.manual_seed takes up to 2**63 - 1 without wrapping oddities
