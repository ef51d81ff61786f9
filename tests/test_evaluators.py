"""Evaluating labelled examples: batched by length, the predictions in the split's order, as one at a time."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from far.evaluation import metrics
from far.evaluation.labels import LabelEvaluator, TextMetric
from far.evaluation.scores import GlueScores
from far.evaluation.squad_scores import squad_scores, squad_v2_scores


def pad(rows: list[dict]) -> dict:
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("num_labels", [1, 3])
def test_length_sorted_batches_predict_in_the_splits_order_as_one_example_at_a_time(num_labels):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        num_labels=num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config)
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, size=23)  # unsorted, with ties
    rows = [{"input_ids": rng.integers(1, 50, size=n).tolist(), "labels": i % 3} for i, n in enumerate(lengths)]
    names = () if num_labels == 1 else ("a", "b", "c")
    metric = TextMetric("regression" if num_labels == 1 else "classification")
    batched = LabelEvaluator(rows, pad, label_names=names, metric=metric, batch_size=4)
    alone = LabelEvaluator(rows, pad, label_names=names, metric=metric, batch_size=1)
    scores = batched(model)
    assert scores == pytest.approx(alone(model), abs=1e-6)
    if num_labels == 1:
        np.testing.assert_allclose(batched.predictions, alone.predictions, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(batched.predictions, alone.predictions)
    assert model.training  # put back in the mode it was found in


@pytest.mark.slow  # a fresh process importing every training command: 3-5 CPU s
def test_a_glue_or_squad_run_scores_without_importing_evaluate():
    # `evaluate` pulls in transformers.pipelines: 0.4 CPU-s and 30 MiB of a short run's whole process, for
    # wrappers a run does not call. The evaluators, and every module a training command imports, score with
    # far's own arithmetic.
    code = (
        "import sys\n"
        "import far.cli.demo, far.cli.glue, far.cli.squad, far.cli.train, far.recipes.runs, far.recipes.files_run\n"
        "from far.evaluation.evaluators import GlueEvaluator, SquadEvaluator\n"
        "from far.data.glue import GLUE_TASKS\n"
        "scores = GlueEvaluator(GLUE_TASKS['stsb'], [], None).metric\n"
        "scores.compute(predictions=[0.1, 0.5, 0.2], references=[0, 1, 1])\n"
        "print(sorted(m for m in ('evaluate',) if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("task", ["cola", "sst2", "mrpc", "stsb"])
def test_the_evaluators_glue_scores_are_the_evaluate_modules(task):
    rng = np.random.default_rng(0)
    regression = task == "stsb"
    predictions = rng.normal(size=40) if regression else rng.integers(0, 2, 40)
    references = rng.normal(size=40) if regression else rng.integers(0, 2, 40)
    expected = metrics.load("glue", task).compute(predictions=predictions, references=references)
    assert GlueScores(task).compute(predictions=predictions, references=references) == expected


def test_the_evaluators_squad_scores_are_the_evaluate_modules():
    references = [
        {"id": "a", "answers": {"text": ["Denver Broncos", "Broncos"], "answer_start": [0, 7]}},
        {"id": "b", "answers": {"text": ["1996"], "answer_start": [3]}},
        {"id": "c", "answers": {"text": [], "answer_start": []}},
    ]
    predictions = [
        {"id": "a", "prediction_text": "the Broncos", "no_answer_probability": 0.25},
        {"id": "b", "prediction_text": "in 1995", "no_answer_probability": 0.625},
        {"id": "c", "prediction_text": "", "no_answer_probability": 0.875},
    ]
    # probabilities a float32 holds exactly: the `evaluate` module stores them as float32
    v1 = [{"id": p["id"], "prediction_text": p["prediction_text"]} for p in predictions[:2]]
    assert squad_scores(v1, references[:2]) == metrics.load("squad").compute(predictions=v1, references=references[:2])
    assert squad_scores(v1, references[:2]) == {"exact_match": 50.0, "f1": 50.0}
    expected = metrics.load("squad_v2").compute(predictions=predictions, references=references)
    assert squad_v2_scores(predictions, references) == expected
    assert squad_v2_scores(predictions, references, 0.5) == metrics.load("squad_v2").compute(
        predictions=predictions, references=references, no_answer_threshold=0.5
    )
