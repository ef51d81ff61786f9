"""The metrics of FAR's GLUE and SQuAD scripts, as local `evaluate` modules (the hub's cannot be fetched offline).

`evaluate.load("accuracy")` needs the hub; these are the same metrics built locally, with the same output keys,
kept in memory (no cache files). The arithmetic is `far.evaluation.scores` and `far.evaluation.squad_scores`
(the official SQuAD scripts'), so the modules and a run's own scoring agree by construction.

>>> from far.evaluation import metrics
>>> metrics.load("glue", "cola").compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])
{'matthews_correlation': 0.577...}
"""

from __future__ import annotations

import datasets
import evaluate

from far.evaluation.scores import (
    GLUE_METRICS,
    accuracy,
    check_glue_task,
    f1,
    glue_scores,
    matthews_correlation,
    pearson,
    rankdata,
    spearman,
)
from far.evaluation.squad_scores import exact_match, normalize_answer, squad_scores, squad_v2_scores, token_f1


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


_ANSWERS = {"text": datasets.List(datasets.Value("string")), "answer_start": datasets.List(datasets.Value("int32"))}


class Squad(LocalMetric):
    """SQuAD v1.1: `{"exact_match": %, "f1": %}`; a question without a prediction scores 0.

    Predictions are `{"id", "prediction_text"}`; references `{"id", "answers": {"text": [...], "answer_start": [...]}}`.

    Example:
        >>> Squad().compute(predictions=[{"id": "q", "prediction_text": "the Broncos"}],
        ...                 references=[{"id": "q", "answers": {"text": ["Denver Broncos"], "answer_start": [0]}}])
        {'exact_match': 0.0, 'f1': 66.66...}
    """

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="SQuAD v1.1 exact match and F1.",
            citation="Rajpurkar et al., SQuAD: 100,000+ Questions for Machine Comprehension of Text, EMNLP 2016.",
            features=datasets.Features(
                {
                    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                    "references": {"id": datasets.Value("string"), "answers": _ANSWERS},
                }
            ),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return squad_scores(predictions, references)


class SquadV2(LocalMetric):
    """SQuAD v2.0, as the official script: exact, f1, total, HasAns_*, NoAns_*, best_exact/f1 and thresholds.

    Predictions are `{"id", "prediction_text", "no_answer_probability"}`; a question is answered "no
    answer" when its probability exceeds `no_answer_threshold` (default 1.0: never, so the text decides).
    Scores are percentages. A question without a prediction scores 0 and counts in the totals (the v1.1
    script's rule; the v2.0 script leaves it out), so a partial prediction file cannot look better.
    """

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="SQuAD v2.0 exact match and F1 with unanswerable questions.",
            citation="Rajpurkar et al., Know What You Don't Know: Unanswerable Questions for SQuAD, ACL 2018.",
            features=datasets.Features(
                {
                    "predictions": {
                        "id": datasets.Value("string"),
                        "prediction_text": datasets.Value("string"),
                        "no_answer_probability": datasets.Value("float32"),
                    },
                    "references": {"id": datasets.Value("string"), "answers": _ANSWERS},
                }
            ),
        )

    def _compute(self, predictions, references, no_answer_threshold: float = 1.0) -> dict[str, float]:
        return squad_v2_scores(predictions, references, no_answer_threshold)


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
