"""SQuAD v1.1 and v2.0 scores as `evaluate` modules; the arithmetic (the official scripts') is
`far.evaluation.squad_scores`."""

from __future__ import annotations

import datasets
import evaluate

from far.evaluation.metrics.classification import LocalMetric
from far.evaluation.squad_scores import exact_match, normalize_answer, squad_scores, squad_v2_scores, token_f1

__all__ = ["Squad", "SquadV2", "exact_match", "normalize_answer", "token_f1"]

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
