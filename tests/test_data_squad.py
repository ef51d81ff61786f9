"""far.data.squad: SQuAD JSON in the hub's form, the article split, and run_qa-style features."""

from __future__ import annotations

import json

import pytest

from far.data.squad import (
    load_squad,
    prepare_eval_features,
    read_squad_json,
    split_by_article,
    squad_eval_dataset,
    squad_train_dataset,
)
from far.evaluation.metrics import normalize_answer

CONTEXT = (
    "Super Bowl 50 was an American football game to determine the champion of the National Football "
    "League for the 2015 season. The Denver Broncos defeated the Carolina Panthers 24 to 10 to earn their "
    "third Super Bowl title. The game was played on February 7, 2016, at Levi's Stadium in Santa Clara."
)


def _article(title: str, n: int, impossible: bool = False) -> dict:
    qas = [
        {
            "id": f"{title}-{i}",
            "question": "  Who won Super Bowl 50?",
            "answers": [{"text": "Denver Broncos", "answer_start": CONTEXT.index("Denver Broncos")}],
        }
        for i in range(n)
    ]
    qas.append(
        {
            "id": f"{title}-where",
            "question": "Where was the game played?",
            "answers": [{"text": "Levi's Stadium", "answer_start": CONTEXT.index("Levi's Stadium")}],
        }
    )
    if impossible:
        qas.append({"id": f"{title}-none", "question": "Who sang?", "answers": [], "is_impossible": True})
    return {"title": title, "paragraphs": [{"context": CONTEXT, "qas": qas}]}


def _squash(text: str) -> str:
    return normalize_answer(text).replace(" ", "")


@pytest.fixture
def squad_dir(tmp_path):
    root = tmp_path / "data"
    (root / "squad").mkdir(parents=True)
    data = {"version": "1.1", "data": [_article("A", 2), _article("B", 1), _article("C", 1), _article("D", 0)]}
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps(data))
    (root / "v2.json").write_text(json.dumps({"version": "v2.0", "data": [_article("E", 1, impossible=True)]}))
    return root


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


def test_read_flattens_in_hub_form(squad_dir):
    rows = read_squad_json(squad_dir / "squad" / "dev-v1.1.json")
    assert rows.column_names == ["id", "title", "context", "question", "answers"]
    assert len(rows) == 3 + 2 + 2 + 1
    assert rows[0]["answers"] == {"text": ["Denver Broncos"], "answer_start": [CONTEXT.index("Denver Broncos")]}
    v2 = read_squad_json(squad_dir / "v2.json")
    assert v2[-1]["answers"] == {"text": [], "answer_start": []}


def test_split_by_article_keeps_articles_whole(squad_dir):
    splits = load_squad("1.1", squad_dir, holdout_articles=2)
    assert set(splits["train"]["title"]) == {"A", "B"} and set(splits["validation"]["title"]) == {"C", "D"}
    with pytest.raises(ValueError, match="from 1 to 3 .*got 10"):  # the default, 10, is too many for 4 articles
        load_squad("1.1", squad_dir)


def test_split_bounds_and_conflicting_options(squad_dir):
    rows = read_squad_json(squad_dir / "squad" / "dev-v1.1.json")
    for bad in (0, 4, 1.5):
        with pytest.raises(ValueError, match="from 1 to 3 .*4 articles"):
            split_by_article(rows, bad)
    with pytest.raises(ValueError, match="not both"):
        load_squad("1.1", squad_dir, train_file=squad_dir / "v2.json", holdout_articles=2)
    splits = load_squad("1.1", squad_dir, train_file=squad_dir / "v2.json")
    assert len(splits["train"]) == 3 and len(splits["validation"]) == 8


def test_missing_and_malformed_files(squad_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        load_squad("2.0", squad_dir)
    assert str(squad_dir / "squad" / "dev-v2.0.json") in str(e.value) and "--data-dir" in str(e.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_squad("1.1", eval_file=tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text(json.dumps({"data": [{"title": "x", "paragraphs": [{"qas": []}]}]}))
    with pytest.raises(ValueError, match="not in SQuAD's format.*'context'"):
        read_squad_json(tmp_path / "bad.json")
    (tmp_path / "text.json").write_text("question\tanswer\n")
    with pytest.raises(ValueError, match="not a JSON file"):
        read_squad_json(tmp_path / "text.json")
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        load_squad("3.0", squad_dir)


def test_train_features_point_at_the_answer(squad_dir, tokenizer):
    rows = read_squad_json(squad_dir / "squad" / "dev-v1.1.json")
    features = squad_train_dataset(rows, tokenizer, max_length=384, doc_stride=128)
    assert len(features) == len(rows)  # short contexts: one window each
    for feature, row in zip(features, rows, strict=True):
        span = feature["input_ids"][feature["start_positions"] : feature["end_positions"] + 1]
        # decode() spaces out word pieces ("levi ' s"): compare without spaces.
        assert _squash(tokenizer.decode(span)) == _squash(row["answers"]["text"][0])


def test_long_context_windows_overlap_and_label_cls_without_answer(squad_dir, tokenizer):
    rows = read_squad_json(squad_dir / "squad" / "dev-v1.1.json").select([0])
    features = squad_train_dataset(rows, tokenizer, max_length=40, doc_stride=10)
    assert len(features) > 2 and all(len(ids) <= 40 for ids in features["input_ids"])
    labelled = [f for f in features if f["start_positions"] != 0]
    assert labelled and any(f["start_positions"] == 0 == f["end_positions"] for f in features)  # [CLS]
    for f in labelled:
        span = tokenizer.decode(f["input_ids"][f["start_positions"] : f["end_positions"] + 1])
        assert normalize_answer(span) == "denver broncos"
    v2 = read_squad_json(squad_dir / "v2.json").select([2])  # the impossible question
    assert squad_train_dataset(v2, tokenizer)[0]["start_positions"] == 0


def test_eval_features_keep_ids_and_context_offsets(squad_dir, tokenizer):
    rows = read_squad_json(squad_dir / "squad" / "dev-v1.1.json").select([0, 1])
    features = squad_eval_dataset(rows, tokenizer, max_length=40, doc_stride=10)
    assert set(features["example_id"]) == {"A-0", "A-1"}
    for f in features:
        offsets = f["offset_mapping"]
        assert offsets[0] is None and offsets[-1] is None  # [CLS] and [SEP]: never part of an answer
        context = [o for o in offsets if o is not None]
        assert context and all(0 <= s <= e <= len(CONTEXT) for s, e in context)
    with pytest.raises(ValueError, match="doc_stride"):
        prepare_eval_features(rows[:1], tokenizer, max_length=40, doc_stride=30)


def test_shared_squad_dev_split(data_dir):
    splits = load_squad("1.1", data_dir)
    train, dev = splits["train"], splits["validation"]
    assert len(train) + len(dev) == 10570
    assert len(set(dev["title"])) == 10 and len(set(train["title"])) == 38
    assert not set(train["title"]) & set(dev["title"])
