"""GLUE's per-task metrics as one `evaluate` module, configured by task name (as the hub's "glue" metric)."""

from __future__ import annotations

import evaluate

from far.evaluation.metrics.classification import LocalMetric, pair_features
from far.evaluation.scores import GLUE_METRICS, check_glue_task, glue_scores

__all__ = ["GLUE_METRICS", "Glue"]


class Glue(LocalMetric):
    """The metrics of one GLUE task; `config_name` is the task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).

    Predictions are class ids, or scores for stsb.

    Example:
        >>> Glue("mrpc").compute(predictions=[1, 0, 1], references=[1, 1, 1])
        {'f1': 0.8, 'accuracy': 0.666...}
    """

    def _info(self) -> evaluate.MetricInfo:
        check_glue_task(self.config_name)
        return evaluate.MetricInfo(
            description=f"GLUE {self.config_name}: {', '.join(GLUE_METRICS[self.config_name])}.",
            citation="",
            features=pair_features("float64" if self.config_name == "stsb" else "int64"),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return glue_scores(self.config_name, predictions, references)
