"""Classification metrics as `evaluate` modules: accuracy, F1 and Matthews correlation.

`evaluate.load("accuracy")` needs the hub; these are the same metrics built locally, with the same
output keys, so `Accuracy().compute(predictions=..., references=...)` works offline.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np

_INT_FEATURES = datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")})


class LocalMetric(evaluate.Metric):
    """An `evaluate.Metric` kept in memory by default: no cache files, no hub, safe to call repeatedly."""

    def __init__(self, config_name: str | None = None, keep_in_memory: bool = True, **kwargs) -> None:
        super().__init__(config_name=config_name, keep_in_memory=keep_in_memory, **kwargs)


def _as_int_arrays(predictions, references) -> tuple[np.ndarray, np.ndarray]:
    predictions, references = np.asarray(predictions, dtype=np.int64), np.asarray(references, dtype=np.int64)
    if predictions.shape != references.shape or predictions.ndim != 1:
        raise ValueError(
            f"predictions and references must be two 1-D lists of the same length, got "
            f"shapes {predictions.shape} and {references.shape}"
        )
    if predictions.size == 0:
        raise ValueError("cannot compute a metric on zero examples")
    return predictions, references


def accuracy(predictions, references) -> float:
    predictions, references = _as_int_arrays(predictions, references)
    return float((predictions == references).mean())


def f1(predictions, references, pos_label: int = 1, average: str = "binary") -> float:
    """Binary F1 of `pos_label` (as sklearn's `f1_score`), or the unweighted mean over classes for "macro".

    A class with no true and no predicted example scores 0.0, as sklearn does (`zero_division=0`).
    """
    predictions, references = _as_int_arrays(predictions, references)
    if average not in ("binary", "macro"):
        raise ValueError(f"average must be 'binary' or 'macro', got {average!r}")
    labels = [pos_label] if average == "binary" else np.union1d(predictions, references).tolist()
    scores = []
    for label in labels:
        tp = int(((predictions == label) & (references == label)).sum())
        fp = int(((predictions == label) & (references != label)).sum())
        fn = int(((predictions != label) & (references == label)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(scores))


def matthews_correlation(predictions, references) -> float:
    """Matthews correlation coefficient, multi-class (Gorodkin's R_K), 0.0 where it is undefined (as sklearn)."""
    predictions, references = _as_int_arrays(predictions, references)
    classes, encoded = np.unique(np.concatenate([references, predictions]), return_inverse=True)
    n = len(references)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)  # (true, predicted)
    np.add.at(confusion, (encoded[:n], encoded[n:]), 1.0)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)  # per-class true and predicted counts
    correct, total = np.trace(confusion), confusion.sum()
    numerator = correct * total - t @ p
    denominator = np.sqrt((total**2 - p @ p) * (total**2 - t @ t))
    return float(numerator / denominator) if denominator > 0 else 0.0


class Accuracy(LocalMetric):
    """Fraction of predictions equal to the reference label: `{"accuracy": float}`.

    Example:
        >>> Accuracy().compute(predictions=[0, 1, 1], references=[0, 1, 0])
        {'accuracy': 0.666...}
    """

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Accuracy: fraction of correct predictions.", citation="", features=_INT_FEATURES
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"accuracy": accuracy(predictions, references)}


class F1(LocalMetric):
    """F1 of the positive class (`pos_label=1`), or macro F1 with `average="macro"`: `{"f1": float}`."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="F1: harmonic mean of precision and recall.", citation="", features=_INT_FEATURES
        )

    def _compute(self, predictions, references, pos_label: int = 1, average: str = "binary") -> dict[str, float]:
        return {"f1": f1(predictions, references, pos_label=pos_label, average=average)}


class MatthewsCorrelation(LocalMetric):
    """Matthews correlation coefficient (CoLA's metric), in [-1, 1]: `{"matthews_correlation": float}`."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(description="Matthews correlation coefficient.", citation="", features=_INT_FEATURES)

    def _compute(self, predictions, references) -> dict[str, float]:
        return {"matthews_correlation": matthews_correlation(predictions, references)}
