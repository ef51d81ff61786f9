"""Evaluation: evaluators that score a model and keep its predictions, SQuAD's post-processing, the metrics.

An evaluator is the `eval_fn(model) -> dict[str, float]` that `far.finetune` takes; the metrics
(`far.evaluation.metrics`) are local `evaluate` modules, since the hub's cannot be fetched offline.

>>> from far.evaluation import metrics
>>> metrics.load("glue", "cola").compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])
{'matthews_correlation': 0.577...}
"""

from __future__ import annotations

from far.lazy import lazy_face

# On first use (PEP 562): the GLUE and SQuAD evaluators import `datasets`; scores and labels need neither it nor
# `evaluate`.
lazy_face(
    __name__,
    {
        "far.evaluation.evaluators": ("Evaluator", "GlueEvaluator", "SquadEvaluator"),
        "far.evaluation.labels": ("LabelEvaluator", "TextMetric"),
        "far.evaluation.squad_postprocess": ("QAPredictions", "postprocess_qa_predictions"),
    },
)
