"""GLUE's per-task metrics as one `evaluate` module, configured by task name (as the hub's "glue" metric)."""

from __future__ import annotations

import datasets
import evaluate

from far.evaluation.metrics.classification import LocalMetric
from far.evaluation.scores import accuracy, f1, matthews_correlation, pearson, spearman

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

_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearmanr": spearman,
}


class Glue(LocalMetric):
    """The metrics of one GLUE task; `config_name` is the task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).

    Predictions are class ids, or scores for stsb.

    Example:
        >>> Glue("mrpc").compute(predictions=[1, 0, 1], references=[1, 1, 1])
        {'f1': 0.8, 'accuracy': 0.666...}
    """

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in GLUE_METRICS:
            raise ValueError(f"unknown GLUE task {self.config_name!r}; choose one of {', '.join(GLUE_METRICS)}")
        dtype = "float64" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=f"GLUE {self.config_name}: {', '.join(GLUE_METRICS[self.config_name])}.",
            citation="",
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return {name: _FUNCTIONS[name](predictions, references) for name in GLUE_METRICS[self.config_name]}
