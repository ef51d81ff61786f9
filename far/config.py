"""The frozen configuration of one FAR reconfiguration."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

SELECTIONS = ("per_layer", "global", "random")


def check_retention(retention: object) -> float:
    """Return `retention` as a float, or raise if it is not a number in (0, 1]."""
    if isinstance(retention, bool) or not isinstance(retention, numbers.Real):
        raise TypeError(
            f"retention must be a number in (0, 1], got {retention!r} of type "
            f"{type(retention).__name__}; e.g. retention=0.4 keeps 40% of each FFN's nodes trainable"
        )
    value = float(retention)
    if math.isnan(value) or not 0.0 < value <= 1.0:
        raise ValueError(
            f"retention must be in (0, 1], got {retention!r}; it is the fraction of FFN nodes that "
            "stay trainable (0.4 in the FAR paper, 1.0 keeps every node)"
        )
    return value


@dataclass(frozen=True)
class FARConfig:
    """How a model is reconfigured.

    Args:
        retention: Fraction of each FFN's nodes that stay trainable (the *learners*), in (0, 1].
        selection: `"per_layer"` (top nodes of each FFN by priming score), `"global"` (top nodes
            across all FFNs, at least one per FFN) or `"random"` (seeded; the paper's baseline).
        seed: Seed of the random selection; unused by the other strategies.
        freeze_embeddings: Also freeze every `nn.Embedding` of the model (word, position and
            token-type embeddings; a tied LM head is frozen with them).
    """

    retention: float = 0.4
    selection: str = "per_layer"
    seed: int = 0
    freeze_embeddings: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "retention", check_retention(self.retention))
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(map(repr, SELECTIONS))}, got {self.selection!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.freeze_embeddings, bool):
            raise TypeError(f"freeze_embeddings must be True or False, got {self.freeze_embeddings!r}")

    def to_dict(self) -> dict:
        return asdict(self)
