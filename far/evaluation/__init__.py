"""Evaluation: evaluators that score a model and keep its predictions, SQuAD's post-processing, the metrics.

An evaluator is the `eval_fn(model) -> dict[str, float]` that `far.finetune` takes; the metrics
(`far.evaluation.metrics`) are local `evaluate` modules, since the hub's cannot be fetched offline.

>>> from far.evaluation import metrics
>>> metrics.load("glue", "cola").compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])
{'matthews_correlation': 0.577...}
"""

from __future__ import annotations

from far.lazy import lazy_names

# On first use (PEP 562): the GLUE and SQuAD evaluators import `datasets`; scores and labels need neither it nor
# `evaluate`.
_LAZY = {
    "Evaluator": "far.evaluation.evaluators",
    "GlueEvaluator": "far.evaluation.evaluators",
    "LabelEvaluator": "far.evaluation.labels",
    "SquadEvaluator": "far.evaluation.evaluators",
    "TextMetric": "far.evaluation.labels",
    "QAPredictions": "far.evaluation.squad_postprocess",
    "postprocess_qa_predictions": "far.evaluation.squad_postprocess",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
