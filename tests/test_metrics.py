"""far.evaluation.metrics: the local `evaluate` modules against scikit-learn / scipy and hand-worked SQuAD cases."""

from __future__ import annotations

import math

import evaluate
import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from far.evaluation import metrics

RNG = np.random.default_rng(0)


def _labels(n: int, k: int) -> np.ndarray:
    return RNG.integers(0, k, size=n)


@pytest.mark.parametrize("k", [2, 3])
def test_classification_metrics_match_sklearn(k):
    for _ in range(5):
        refs, preds = _labels(50, k), _labels(50, k)
        assert metrics.load("accuracy").compute(predictions=preds, references=refs)["accuracy"] == pytest.approx(
            sk.accuracy_score(refs, preds)
        )
        mcc = metrics.load("matthews_correlation").compute(predictions=preds, references=refs)
        assert mcc["matthews_correlation"] == pytest.approx(sk.matthews_corrcoef(refs, preds))
        macro = metrics.load("f1").compute(predictions=preds, references=refs, average="macro")["f1"]
        assert macro == pytest.approx(sk.f1_score(refs, preds, average="macro", zero_division=0))
    refs, preds = _labels(40, 2), _labels(40, 2)
    assert metrics.f1(preds, refs) == pytest.approx(sk.f1_score(refs, preds))


def test_degenerate_cases_follow_sklearn():
    constant, refs = [1] * 6, [0, 1, 0, 1, 1, 0]
    assert metrics.matthews_correlation(constant, refs) == 0.0 == sk.matthews_corrcoef(refs, constant)
    assert metrics.matthews_correlation(refs, refs) == pytest.approx(1.0)
    assert metrics.matthews_correlation([1 - r for r in refs], refs) == pytest.approx(-1.0)
    no_positive = [0] * 6
    assert metrics.f1(no_positive, [0] * 6) == 0.0 == sk.f1_score([0] * 6, no_positive, zero_division=0)


def test_correlations_match_scipy_with_ties():
    refs = RNG.integers(0, 6, size=80).astype(float)  # many ties, like STS-B's half-point scores
    preds = refs + RNG.normal(0, 1.5, size=80)
    preds[:10] = 2.0  # ties on the prediction side too
    assert metrics.pearson(preds, refs) == pytest.approx(stats.pearsonr(preds, refs)[0])
    assert metrics.spearman(preds, refs) == pytest.approx(stats.spearmanr(preds, refs)[0])
    np.testing.assert_allclose(metrics.rankdata(preds), stats.rankdata(preds))
    result = metrics.load("glue", "stsb").compute(predictions=preds, references=refs)
    assert result == pytest.approx(
        {"pearson": stats.pearsonr(preds, refs)[0], "spearmanr": stats.spearmanr(preds, refs)[0]}
    )
    assert math.isnan(metrics.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # constant side: undefined, as scipy


@pytest.mark.parametrize(
    "task,keys",
    [
        ("cola", {"matthews_correlation"}),
        ("sst2", {"accuracy"}),
        ("mrpc", {"accuracy", "f1"}),
        ("qqp", {"accuracy", "f1"}),
        ("mnli", {"accuracy"}),
        ("qnli", {"accuracy"}),
        ("rte", {"accuracy"}),
        ("wnli", {"accuracy"}),
    ],
)
def test_glue_module_reports_each_tasks_metrics(task, keys):
    module = metrics.load("glue", task)
    assert isinstance(module, evaluate.EvaluationModule)
    refs, preds = _labels(30, 2), _labels(30, 2)
    result = module.compute(predictions=preds, references=refs)
    assert set(result) == keys
    if "f1" in keys:
        assert result["f1"] == pytest.approx(sk.f1_score(refs, preds))


def test_modules_accumulate_batches():
    module = metrics.load("accuracy")
    module.add_batch(predictions=[1, 1], references=[1, 0])
    module.add_batch(predictions=[0], references=[0])
    assert module.compute() == {"accuracy": pytest.approx(2 / 3)}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metrics.load("bleu")
    with pytest.raises(ValueError, match="needs a task"):
        metrics.load("glue")
    with pytest.raises(ValueError, match="unknown GLUE task 'foo'"):
        metrics.load("glue", "foo")
    with pytest.raises(ValueError, match="same length"):
        metrics.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="at least 2"):
        metrics.pearson([1.0], [1.0])


# SQuAD: the official normalisation and hand-worked scores.


@pytest.mark.parametrize(
    "raw,normalized",
    [
        ("The Denver Broncos!", "denver broncos"),
        ("  an   apple, a pear and the  fig ", "apple pear and fig"),
        ("Theory of a-b", "theory of ab"),  # "the" inside a word stays; punctuation goes
        ("A", ""),
    ],
)
def test_normalize_answer(raw, normalized):
    assert metrics.normalize_answer(raw) == normalized


def _qa(qid: str, *answers: str) -> dict:
    return {"id": qid, "answers": {"text": list(answers), "answer_start": [0] * len(answers)}}


def test_squad_v1_hand_worked():
    refs = [_qa("q1", "Denver Broncos", "Broncos"), _qa("q2", "Santa Clara, California"), _qa("q3", "1998")]
    preds = [
        {"id": "q1", "prediction_text": "the Broncos"},  # EM 1 against "Broncos"
        {"id": "q2", "prediction_text": "Levi's Stadium in Santa Clara"},
        {"id": "elsewhere", "prediction_text": "1998"},
    ]  # q3 has no prediction: scores 0
    result = metrics.load("squad").compute(predictions=preds, references=refs)
    # q2: tokens {levis, stadium, in, santa, clara} vs {santa, clara, california}: 2 shared, P=2/5, R=2/3.
    f1_q2 = 2 * (2 / 5) * (2 / 3) / (2 / 5 + 2 / 3)
    assert result["exact_match"] == pytest.approx(100 * 1 / 3)
    assert result["f1"] == pytest.approx(100 * (1 + f1_q2) / 3)


def test_squad_v2_no_answer_handling():
    refs = [_qa("has", "Paris"), _qa("none"), _qa("none2")]
    preds = [
        {"id": "has", "prediction_text": "in Paris", "no_answer_probability": 0.2},
        {"id": "none", "prediction_text": "", "no_answer_probability": 0.9},
        {"id": "none2", "prediction_text": "London", "no_answer_probability": 0.6},
    ]
    module = metrics.load("squad_v2")
    result = module.compute(predictions=preds, references=refs)
    # "in Paris" vs "Paris": P=1/2, R=1 -> F1 2/3, EM 0; "" on a no-answer question is right; "London" is wrong.
    assert result["exact"] == pytest.approx(100 * 1 / 3)
    assert result["f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)
    assert (result["HasAns_total"], result["NoAns_total"], result["total"]) == (1, 2, 3)
    assert result["HasAns_f1"] == pytest.approx(100 * 2 / 3)
    assert result["NoAns_exact"] == pytest.approx(50.0)
    # Official best-threshold scan (raw scores): abstaining on everything scores 2 of 3; answering "has"
    # (p=0.2) adds 0 exact / 2/3 F1, answering "none2" (p=0.6) loses 1, "none" (p=0.9, empty) loses nothing.
    assert result["best_exact"] == pytest.approx(100 * 2 / 3) and result["best_exact_thresh"] == 0.0
    assert result["best_f1"] == pytest.approx(100 * (2 + 2 / 3) / 3)
    assert result["best_f1_thresh"] == pytest.approx(0.2)
    # With a threshold, "none2" (0.6 > 0.5) counts as answered "no answer": right.
    thresholded = module.compute(predictions=preds, references=refs, no_answer_threshold=0.5)
    assert thresholded["exact"] == pytest.approx(100 * 2 / 3)


def test_squad_token_f1_edge_cases():
    assert metrics.token_f1("", "") == 1.0  # v2: both say "no answer"
    assert metrics.token_f1("a", "the") == 1.0  # both normalise to nothing
    assert metrics.token_f1("Paris", "") == 0.0
    assert metrics.exact_match("The  cat.", "cat") == 1.0
    with pytest.raises(ValueError, match="duplicate"):
        preds = [{"id": "q", "prediction_text": "x"}] * 2
        metrics.load("squad").compute(predictions=preds, references=[_qa("q", "x"), _qa("q", "y")])
