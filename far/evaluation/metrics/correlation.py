"""Correlation metrics as `evaluate` modules: Pearson and Spearman (STS-B's metrics)."""

from __future__ import annotations

import math

import datasets
import evaluate
import numpy as np

from far.evaluation.metrics.classification import LocalMetric

_FLOAT_FEATURES = datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")})


def _as_float_arrays(predictions, references) -> tuple[np.ndarray, np.ndarray]:
    predictions, references = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    if predictions.shape != references.shape or predictions.ndim != 1:
        raise ValueError(
            f"predictions and references must be two 1-D lists of the same length, got "
            f"shapes {predictions.shape} and {references.shape}"
        )
    if predictions.size < 2:
        raise ValueError(f"a correlation needs at least 2 examples, got {predictions.size}")
    return predictions, references


def rankdata(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (scipy.stats.rankdata's default, "average")."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start of every run of equal values in the sorted order, then each run's mean rank.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_ranks = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(mean_ranks, ends - starts)
    return ranks


def pearson(predictions, references) -> float:
    """Pearson's r; NaN when either side is constant (as scipy.stats.pearsonr)."""
    x, y = _as_float_arrays(predictions, references)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator > 0 else float("nan")


def spearman(predictions, references) -> float:
    """Spearman's rho: Pearson's r of the (tie-averaged) ranks."""
    x, y = _as_float_arrays(predictions, references)
    return pearson(rankdata(x), rankdata(y))


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
