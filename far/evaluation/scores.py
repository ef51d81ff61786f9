"""The metrics' arithmetic on plain lists or arrays: accuracy, F1, Matthews correlation, Pearson, Spearman,
and each GLUE task's set of them.

Only numpy: a run scores with these without importing `evaluate` (0.4 CPU-s and 30 MiB: it pulls in
`transformers.pipelines`) or `datasets` (docs/design.md, "Resident memory"). `far.evaluation.metrics`
wraps the same functions as `evaluate` modules, so the two agree by construction.

    >>> accuracy([0, 1, 1], [0, 1, 0])
    0.666...
"""

from __future__ import annotations

import math

import numpy as np


def _as_arrays(predictions, references, dtype: type, least: int) -> tuple[np.ndarray, np.ndarray]:
    """Two 1-D arrays of one length, at least `least` examples each (what the metric needs to be defined)."""
    predictions, references = np.asarray(predictions, dtype=dtype), np.asarray(references, dtype=dtype)
    if predictions.shape != references.shape or predictions.ndim != 1:
        raise ValueError(
            f"predictions and references must be two 1-D lists of the same length, got "
            f"shapes {predictions.shape} and {references.shape}"
        )
    if predictions.size < least:
        raise ValueError(
            "cannot compute a metric on zero examples"
            if least == 1
            else f"a correlation needs at least {least} examples, got {predictions.size}"
        )
    return predictions, references


def accuracy(predictions, references) -> float:
    predictions, references = _as_arrays(predictions, references, np.int64, least=1)
    return float((predictions == references).mean())


def f1(predictions, references, pos_label: int = 1, average: str = "binary") -> float:
    """Binary F1 of `pos_label` (as sklearn's `f1_score`), or the unweighted mean over classes for "macro".

    A class with no true and no predicted example scores 0.0, as sklearn does (`zero_division=0`).
    """
    predictions, references = _as_arrays(predictions, references, np.int64, least=1)
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
    predictions, references = _as_arrays(predictions, references, np.int64, least=1)
    classes, encoded = np.unique(np.concatenate([references, predictions]), return_inverse=True)
    n = len(references)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)  # (true, predicted)
    np.add.at(confusion, (encoded[:n], encoded[n:]), 1.0)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)  # per-class true and predicted counts
    correct, total = np.trace(confusion), confusion.sum()
    numerator = correct * total - t @ p
    denominator = np.sqrt((total**2 - p @ p) * (total**2 - t @ t))
    return float(numerator / denominator) if denominator > 0 else 0.0


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
    x, y = _as_arrays(predictions, references, np.float64, least=2)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator > 0 else float("nan")


def spearman(predictions, references) -> float:
    """Spearman's rho: Pearson's r of the (tie-averaged) ranks."""
    x, y = _as_arrays(predictions, references, np.float64, least=2)
    return pearson(rankdata(x), rankdata(y))


# Task -> the metrics GLUE reports for it, the first being the one to headline.
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

_GLUE_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearmanr": spearman,
}


def check_glue_task(task: str) -> None:
    if task not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}; choose one of {', '.join(GLUE_METRICS)}")


def glue_scores(task: str, predictions, references) -> dict[str, float]:
    """The metrics of one GLUE task (`GLUE_METRICS`); predictions are class ids, or scores for stsb."""
    check_glue_task(task)
    return {name: _GLUE_FUNCTIONS[name](predictions, references) for name in GLUE_METRICS[task]}


class GlueScores:
    """`glue_scores` of one task behind `compute(predictions=..., references=...)`, an `evaluate` module's call.

    Example:
        >>> GlueScores("mrpc").compute(predictions=[1, 0, 1], references=[1, 1, 1])
        {'f1': 0.8, 'accuracy': 0.666...}
    """

    def __init__(self, task: str) -> None:
        check_glue_task(task)
        self.task = task

    def compute(self, *, predictions, references) -> dict[str, float]:
        return glue_scores(self.task, predictions, references)
