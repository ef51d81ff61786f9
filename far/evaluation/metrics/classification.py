"""Classification metrics as `evaluate` modules: accuracy, F1 and Matthews correlation.

`evaluate.load("accuracy")` needs the hub; these are the same metrics built locally, with the same
output keys, so `Accuracy().compute(predictions=..., references=...)` works offline.
"""

from __future__ import annotations

import datasets
import evaluate

from far.evaluation.scores import accuracy, f1, matthews_correlation


def pair_features(dtype: str) -> datasets.Features:
    """Features of a metric over `predictions` and `references` of one `datasets.Value` dtype."""
    return datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)})


class LocalMetric(evaluate.Metric):
    """An `evaluate.Metric` kept in memory by default: no cache files, no hub, safe to call repeatedly.

    A subclass over a pair of values names its `description` and their `dtype`, and computes.
    """

    description = ""
    dtype = "int64"

    def __init__(self, config_name: str | None = None, keep_in_memory: bool = True, **kwargs) -> None:
        super().__init__(config_name=config_name, keep_in_memory=keep_in_memory, **kwargs)

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(description=self.description, citation="", features=pair_features(self.dtype))


class Accuracy(LocalMetric):
    """Fraction of predictions equal to the reference label: `{"accuracy": float}`.

    Example:
        >>> Accuracy().compute(predictions=[0, 1, 1], references=[0, 1, 0])
        {'accuracy': 0.666...}
    """

    description = "Accuracy: fraction of correct predictions."

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"accuracy": accuracy(predictions, references)}


class F1(LocalMetric):
    """F1 of the positive class (`pos_label=1`), or macro F1 with `average="macro"`: `{"f1": float}`."""

    description = "F1: harmonic mean of precision and recall."

    def _compute(self, predictions, references, pos_label: int = 1, average: str = "binary") -> dict[str, float]:
        return {"f1": f1(predictions, references, pos_label=pos_label, average=average)}


class MatthewsCorrelation(LocalMetric):
    """Matthews correlation coefficient (CoLA's metric), in [-1, 1]: `{"matthews_correlation": float}`."""

    description = "Matthews correlation coefficient."

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"matthews_correlation": matthews_correlation(predictions, references)}
