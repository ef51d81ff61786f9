"""The user's own files (`far.data.files`): every format, label mapping, and every bad input's message."""

from __future__ import annotations

import pytest
from conftest import write_rows as write

from far.data.files import DataFileError, LabelSpace, load_text_files, read_table, read_texts, resolve_text_columns

ROWS = [
    {"text": "A warm, funny film.", "label": "positive"},
    {"text": 'He said "dull" twice.', "label": "negative"},
    {"text": "Lovely.", "label": "positive"},
    {"text": "NA", "label": "negative"},  # a text that pandas would take for a missing value
]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl"])
def test_every_format_reads_the_same(tmp_path, suffix):
    train = write(tmp_path / f"train{suffix}", ROWS)
    dev = write(tmp_path / f"dev{suffix}", ROWS[:2])
    data = load_text_files(train, dev)
    assert data.text_columns == ("text",)
    assert data.labels == LabelSpace(("negative", "positive"))  # sorted, as run_glue sorts them
    assert data.train["text"] == [r["text"] for r in ROWS]
    assert data.train["label"] == [1, 0, 1, 0]
    assert data.validation["label"] == [1, 0]
    assert data.name == tmp_path.name  # train.<ext> is named after its folder


def test_formats_can_differ_between_files(tmp_path):
    data = load_text_files(write(tmp_path / "mine.csv", ROWS), write(tmp_path / "held.jsonl", ROWS[1:]))
    assert data.name == "mine"
    assert data.validation["label"] == [0, 1, 0]


def test_pair_columns_and_explicit_columns(tmp_path):
    rows = [
        {"id": i, "sentence1": f"first {i}", "sentence2": f"second {i}", "extra": "x", "gold": i % 2} for i in range(4)
    ]
    path = write(tmp_path / "pairs.csv", rows)
    data = load_text_files(path, path, label_column="gold")
    assert data.text_columns == ("sentence1", "sentence2")
    assert data.labels.names == ("0", "1")  # whole numbers are class ids
    data = load_text_files(path, path, text_columns=["extra"], label_column="gold")
    assert data.text_columns == ("extra",)


def test_default_columns_follow_run_glue(tmp_path):
    assert resolve_text_columns("f", ["idx", "review", "label"]) == ("review",)
    assert resolve_text_columns("f", ["a", "b", "sentence", "label"]) == ("sentence",)
    assert resolve_text_columns("f", ["question", "passage", "label"]) == ("question", "passage")
    with pytest.raises(DataFileError, match="no column to read text from"):
        resolve_text_columns("f", ["id", "label"])


def test_float_labels_mean_regression(tmp_path):
    rows = [{"sentence1": "a", "sentence2": "b", "score": s} for s in ("0", "2.5", "5.000", "1")]
    path = write(tmp_path / "stsb.tsv", rows)
    data = load_text_files(path, path, label_column="score")
    assert data.labels.kind == "regression" and data.labels.num_labels == 1
    assert data.train["label"] == [0.0, 2.5, 5.0, 1.0]


def test_integer_class_ids_keep_numeric_order(tmp_path):
    rows = [{"text": str(i), "label": label} for i, label in enumerate([10, 2, 1, 2])]
    path = write(tmp_path / "ids.jsonl", rows)
    assert load_text_files(path, path).labels.names == ("1", "2", "10")


def test_read_texts_ignores_labels_and_finds_columns(tmp_path):
    path = write(tmp_path / "new.csv", ROWS)
    assert read_texts(path, ["text"]).column_names == ["text"]
    assert read_texts(path, None)["text"][0] == "A warm, funny film."


def _error(tmp_path, train, dev=None, **kwargs) -> str:
    with pytest.raises(DataFileError) as info:
        load_text_files(train, dev or train, **kwargs)
    return str(info.value)


def test_misspelt_columns_list_the_columns_that_exist(tmp_path):
    path = write(tmp_path / "train.csv", ROWS)
    message = _error(tmp_path, path, text_columns=["txt"])
    assert "has no column 'txt'; its columns are: text, label. Did you mean 'text'?" in message
    assert "--text-column" in message
    message = _error(tmp_path, path, label_column="labels")
    assert "no column 'labels'" in message and "Did you mean 'label'?" in message and "--label-column" in message
    dev = write(tmp_path / "dev.csv", [{"sentence": "x", "label": "positive"}])
    assert "dev.csv has no column 'text'; its columns are: sentence, label" in _error(tmp_path, path, dev)


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "is empty; it needs a header row"),
        (b"  \n\n", "is empty"),
        (b"text,label\n", "has a header but no rows"),
        (b"text,label\ncaf\xe9,positive\n", "is not UTF-8 text (byte 0xe9 on line 2); save it as UTF-8"),
    ],
)
def test_empty_and_non_utf8_files(tmp_path, content, message):
    path = tmp_path / "train.csv"
    path.write_bytes(content)
    assert message in _error(tmp_path, path)


def test_unreadable_paths(tmp_path):
    assert "does not exist" in _error(tmp_path, tmp_path / "nope.csv")
    (tmp_path / "folder.csv").mkdir()
    assert "is a folder" in _error(tmp_path, tmp_path / "folder.csv")
    (tmp_path / "data.xlsx").write_text("x")
    assert "unknown format '.xlsx'; use a file ending in .csv, .tsv, .json, .jsonl" in _error(
        tmp_path, tmp_path / "data.xlsx"
    )
    broken = tmp_path / "broken.json"
    broken.write_text('[{"text": "a", "label": 1},')
    assert "could not be read as JSON" in _error(tmp_path, broken)


def test_validation_label_never_seen_in_training(tmp_path):
    train = write(tmp_path / "train.csv", ROWS)
    dev = write(tmp_path / "dev.csv", [*ROWS[:2], {"text": "Meh.", "label": "neutral"}])
    message = _error(tmp_path, train, dev)
    assert "label(s) ['neutral'] (first at row 3) never occur in the training file" in message
    assert "add training examples or drop those rows" in message


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_mixed_label_types(tmp_path, suffix):
    path = write(tmp_path / f"train{suffix}", [*ROWS, {"text": "x", "label": 1}])
    message = _error(tmp_path, path)
    assert "the labels mix text and numbers: 'positive'" in message
    assert "make every label a class name, or every label a number" in message


def test_mixed_label_types_across_files(tmp_path):
    train = write(tmp_path / "train.csv", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    dev = write(tmp_path / "dev.csv", ROWS[:1])
    assert "dev.csv, row 1" in _error(tmp_path, train, dev)


def test_missing_label_and_single_class(tmp_path):
    path = write(tmp_path / "train.csv", [*ROWS, {"text": "no label", "label": ""}])
    assert "row 5 has no label in column 'label'; give every example a label" in _error(tmp_path, path)
    path = write(tmp_path / "one.csv", [r for r in ROWS if r["label"] == "positive"])
    assert "a single class ('positive')" in _error(tmp_path, path)


def test_read_table_keeps_text_as_text(tmp_path):
    path = write(tmp_path / "t.tsv", ROWS)
    assert read_table(path)["text"][3] == "NA"
