"""Correlation metrics as `evaluate` modules: Pearson and Spearman (STS-B's metrics)."""

from __future__ import annotations

from far.evaluation.metrics.classification import LocalMetric
from far.evaluation.scores import pearson, spearman


class Pearson(LocalMetric):
    """Pearson correlation of predicted and reference scores: `{"pearson": float}`."""

    description = "Pearson correlation coefficient."
    dtype = "float64"

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"pearson": pearson(predictions, references)}


class Spearman(LocalMetric):
    """Spearman rank correlation of predicted and reference scores: `{"spearmanr": float}` (GLUE's key)."""

    description = "Spearman rank correlation coefficient."
    dtype = "float64"

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"spearmanr": spearman(predictions, references)}
