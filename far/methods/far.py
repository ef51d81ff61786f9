"""FAR's surgery as a method of a training run: learners chosen by priming, or at random (the paper's baseline)."""

from __future__ import annotations

from dataclasses import dataclass

from far.methods.base import Method


@dataclass(frozen=True)
class Surgery(Method):
    """FAR: split every FFN, keeping `retention` of its nodes trainable, chosen by `selection`."""

    lean_ffn: str | None = "learners"
    selection: str | None = "per_layer"
