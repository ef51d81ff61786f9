"""far.evaluation.squad_postprocess: best valid span from start/end logits, and the official predictions file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from far.data.squad import prepare_eval_features, prepare_train_features
from far.evaluation import postprocess_qa_predictions
from far.evaluation.squad_postprocess import write_predictions

CONTEXT = "abc def ghi"
OFFSETS = [None, (0, 3), (4, 7), (8, 11), None]  # [CLS] abc def ghi [SEP]
EXAMPLE = [{"id": "q", "context": CONTEXT}]


def _answer(start, end, offsets=OFFSETS, **kw):
    features = [{"example_id": "q", "offset_mapping": offsets}]
    return postprocess_qa_predictions(EXAMPLE, features, [np.array(start, float)], [np.array(end, float)], **kw)


def test_best_span_never_outside_the_context():
    # [CLS] and [SEP] have the highest logits but lie outside the context.
    predictions = _answer([10, 1, 5, 0, 9], [10, 0, 1, 6, 9])
    assert predictions.texts == {"q": "def ghi"}  # start "def" (5) + end "ghi" (6)


def test_end_before_start_and_max_answer_length_are_excluded():
    # (start ghi, end abc) would score 18 but ends before it starts.
    assert _answer([0, 0.5, 1, 9, 0], [0, 9, 1, 0, 0]).texts["q"] == "abc"
    start, end = [0, 5, 0, 1, 0], [0, 2, 0, 5, 0]
    assert _answer(start, end, max_answer_length=3).texts["q"] == "abc def ghi"  # 5 + 5
    assert _answer(start, end, max_answer_length=2).texts["q"] == "abc"  # 3 tokens too long: 5 + 2


def test_n_best_limits_the_candidates():
    start, end = [0, 1, 0, 5, 0], [0, 5, 0, 1, 0]
    assert _answer(start, end, n_best=1).texts["q"] == ""  # top start after top end: nothing valid
    assert _answer(start, end, n_best=2).texts["q"] == "ghi"


def test_best_window_wins_and_v2_null_answer():
    features = [
        {"example_id": "q", "offset_mapping": [None, (0, 3), (4, 7), None]},
        {"example_id": "q", "offset_mapping": [None, (4, 7), (8, 11), None]},
    ]
    starts = [np.array([0.0, 2, 1, 0]), np.array([3.0, 0, 4, 0])]
    ends = [np.array([0.0, 2, 1, 0]), np.array([3.0, 0, 4, 0])]
    v1 = postprocess_qa_predictions(EXAMPLE, features, starts, ends)
    assert v1.texts == {"q": "ghi"}  # window 2's "ghi" (8) beats window 1's "abc" (4)
    assert v1.null_odds["q"] == pytest.approx(0 - 8)  # lowest null score over windows (0) minus best span
    null_wins = [np.array([9.0, 2, 1, 0]), np.array([9.0, 0, 4, 0])]
    v2 = postprocess_qa_predictions(EXAMPLE, features, null_wins, null_wins, version_2=True)
    assert v2.texts == {"q": ""} and v2.null_odds["q"] == pytest.approx(18 - 8)
    assert postprocess_qa_predictions(
        EXAMPLE, features, null_wins, null_wins, version_2=True, null_score_diff_threshold=20.0
    ).texts == {"q": "ghi"}
    assert v2.for_metric(version_2=True) == [{"id": "q", "prediction_text": "", "no_answer_probability": 0.0}]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one start and one end logit array per feature"):
        postprocess_qa_predictions(EXAMPLE, [{"example_id": "q", "offset_mapping": OFFSETS}], [], [])
    with pytest.raises(ValueError, match="5 tokens but 3 start"):
        _answer([0, 1, 2], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="positive"):
        _answer([0] * 5, [0] * 5, n_best=0)


def test_round_trip_through_real_windows(minilm_path, tmp_path):
    """Logits peaked at the labelled answer tokens give back the answer text exactly, across windows."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    context = (
        "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
        "region in France. They were descended from Norse raiders and pirates from Denmark, Iceland and "
        "Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia."
    )
    answer = "King Charles III"
    examples = {
        "id": ["n1"],
        "context": [context],
        "question": ["To whom did they swear fealty?"],
        "answers": [{"text": [answer], "answer_start": [context.index(answer)]}],
    }
    train = prepare_train_features(examples, tokenizer, max_length=48, doc_stride=16)
    evals = prepare_eval_features(examples, tokenizer, max_length=48, doc_stride=16)
    assert len(evals["input_ids"]) > 1 and train["input_ids"] == evals["input_ids"]
    starts, ends = [], []
    for i, ids in enumerate(evals["input_ids"]):
        start, end = np.zeros(len(ids)), np.zeros(len(ids))
        if train["start_positions"][i] != 0:  # the window holds the answer
            start[train["start_positions"][i]] = end[train["end_positions"][i]] = 10.0
        starts.append(start)
        ends.append(end)
    features = [
        {"example_id": e, "offset_mapping": o}
        for e, o in zip(evals["example_id"], evals["offset_mapping"], strict=True)
    ]
    predictions = postprocess_qa_predictions([{"id": "n1", "context": context}], features, starts, ends)
    assert predictions.texts == {"n1": answer}
    write_predictions(predictions, tmp_path / "predictions.json", tmp_path / "null_odds.json")
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"n1": answer}
    assert set(json.loads((tmp_path / "null_odds.json").read_text())) == {"n1"}
