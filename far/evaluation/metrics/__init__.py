"""The metrics of FAR's GLUE and SQuAD scripts, as local `evaluate` modules (the hub's cannot be fetched offline).

>>> from far.evaluation import metrics
>>> metrics.load("glue", "cola").compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])
{'matthews_correlation': 0.577...}
"""

from __future__ import annotations

from far.evaluation.metrics.classification import F1, Accuracy, LocalMetric, MatthewsCorrelation
from far.evaluation.metrics.correlation import Pearson, Spearman
from far.evaluation.metrics.glue import GLUE_METRICS, Glue
from far.evaluation.metrics.squad import Squad, SquadV2, exact_match, normalize_answer, token_f1
from far.evaluation.scores import accuracy, f1, matthews_correlation, pearson, rankdata, spearman

METRICS: dict[str, type[LocalMetric]] = {
    "accuracy": Accuracy,
    "f1": F1,
    "matthews_correlation": MatthewsCorrelation,
    "pearson": Pearson,
    "spearmanr": Spearman,
    "glue": Glue,
    "squad": Squad,
    "squad_v2": SquadV2,
}


def load(name: str, config_name: str | None = None, **kwargs) -> LocalMetric:
    """An `evaluate` metric module by its hub name, built locally (the offline stand-in for `evaluate.load`).

    Args:
        name: one of accuracy, f1, matthews_correlation, pearson, spearmanr, glue, squad, squad_v2.
        config_name: the GLUE task for "glue" (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).
        **kwargs: passed to `evaluate.EvaluationModule` (e.g. `experiment_id`).
    """
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}")
    if name == "glue" and config_name is None:
        raise ValueError(f"the glue metric needs a task: load('glue', task) with task one of {', '.join(GLUE_METRICS)}")
    return METRICS[name](config_name=config_name, **kwargs)


__all__ = [
    "F1",
    "GLUE_METRICS",
    "METRICS",
    "Accuracy",
    "Glue",
    "LocalMetric",
    "MatthewsCorrelation",
    "Pearson",
    "Spearman",
    "Squad",
    "SquadV2",
    "accuracy",
    "exact_match",
    "f1",
    "load",
    "matthews_correlation",
    "normalize_answer",
    "pearson",
    "rankdata",
    "spearman",
    "token_f1",
]
