"""The batch order of a device training run: a seeded permutation per epoch, the same in every runtime.

torch's `randperm` cannot be reproduced outside torch, and a run begun in Python may be resumed
by the C++ runner (or the other way round), so the order is defined from SplitMix64 alone:

    splitmix64(x) = z ^ (z >> 31), where, mod 2**64,
        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    base      = splitmix64(seed ^ splitmix64(epoch))
    key[i]    = splitmix64(base + i)                         for i in 0..n-1
    order     = the indices i sorted by key[i] (ties by i)

Batch j of the epoch is examples `order[j*B:(j+1)*B]`; the `n mod B` examples left over are not
used in that epoch (the programs take exactly B examples), and other ones are left over next epoch.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over a uint64 array (arithmetic mod 2**64)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of `n` examples for `epoch` (0-based) of a run seeded with `seed` (int64 indices).

    Example:
        >>> epoch_order(0, 0, 5)  # the same in every process and runtime
    """
    if n < 0 or seed < 0 or epoch < 0:
        raise ValueError(f"seed, epoch and n must be >= 0, got seed={seed}, epoch={epoch}, n={n}")
    base = splitmix64(np.array([(seed & _MASK) ^ int(splitmix64(np.array([epoch], np.uint64))[0])], np.uint64))
    with np.errstate(over="ignore"):
        keys = splitmix64(base + np.arange(n, dtype=np.uint64))
    return np.argsort(keys, kind="stable").astype(np.int64)


def batch_indices(seed: int, epoch: int, batch: int, n: int, batch_size: int) -> np.ndarray:
    """The example indices of batch `batch` of `epoch`."""
    return epoch_order(seed, epoch, n)[batch * batch_size : (batch + 1) * batch_size]
