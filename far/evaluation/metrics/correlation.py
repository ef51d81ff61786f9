"""Correlation metrics as `evaluate` modules: Pearson and Spearman (STS-B's metrics)."""

from __future__ import annotations

import datasets
import evaluate

from far.evaluation.metrics.classification import LocalMetric
from far.evaluation.scores import pearson, spearman

_FLOAT_FEATURES = datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")})


class Pearson(LocalMetric):
    """Pearson correlation of predicted and reference scores: `{"pearson": float}`."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Pearson correlation coefficient.", citation="", features=_FLOAT_FEATURES
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"pearson": pearson(predictions, references)}


class Spearman(LocalMetric):
    """Spearman rank correlation of predicted and reference scores: `{"spearmanr": float}` (GLUE's key)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Spearman rank correlation coefficient.", citation="", features=_FLOAT_FEATURES
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"spearmanr": spearman(predictions, references)}
