"""FAR's surgery as a method of a training run: learners chosen by priming, or at random (the paper's baseline)."""

from __future__ import annotations

from dataclasses import dataclass

from far.config import FARConfig
from far.methods.base import Method


@dataclass(frozen=True)
class Surgery(Method):
    """FAR: split every FFN, keeping `retention` of its nodes trainable, chosen by `selection`."""

    lean_ffn: str | None = "learners"
    selection: str = "per_layer"

    def far_config(
        self,
        retention: float,
        *,
        seed: int = 0,
        freeze_embeddings: bool = False,
        attention_retention: float | None = None,
        freeze_layers: int | str | None = None,
    ) -> FARConfig:
        return FARConfig(
            retention,
            self.selection,
            seed=seed,
            freeze_embeddings=freeze_embeddings,
            attention_retention=attention_retention,
            freeze_layers=freeze_layers,
        )
