"""`far.data.table`: the user's files read without `datasets`, with `datasets`' results where the two overlap."""

from __future__ import annotations

import subprocess
import sys

import datasets
import pytest
from conftest import write_rows

from far.data.table import DataFileError, Table, read_table

ROWS = [{"text": f"sentence {i}, with a comma", "label": i % 3} for i in range(37)]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl"])
def test_read_table_gives_every_row_and_column(tmp_path, suffix):
    table = read_table(write_rows(tmp_path / f"t{suffix}", ROWS))
    assert table.column_names == ["text", "label"] and len(table) == len(ROWS)
    assert table["text"] == [r["text"] for r in ROWS]
    # CSV cells are text as written; JSON keeps its types.
    expected = [r["label"] for r in ROWS] if suffix.startswith(".json") else [str(r["label"]) for r in ROWS]
    assert table["label"] == expected


@pytest.mark.parametrize("test_size,seed", [(0.1, 0), (0.25, 3), (0.5, 42)])
def test_train_test_split_draws_the_rows_datasets_draws(test_size, seed):
    table = Table({"i": list(range(37)), "text": [r["text"] for r in ROWS]})
    ours = table.train_test_split(test_size=test_size, seed=seed)
    theirs = table.to_dataset().train_test_split(test_size=test_size, seed=seed)
    for part in ("train", "test"):
        assert ours[part]["i"] == theirs[part]["i"]
        assert ours[part]["text"] == theirs[part]["text"]


def test_select_and_to_dataset_keep_the_rows():
    table = Table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    assert table.select([2, 0])["b"] == ["z", "x"]
    dataset = table.to_dataset()
    assert isinstance(dataset, datasets.Dataset) and dataset["b"] == ["x", "y", "z"]
    with pytest.raises(ValueError, match="one length"):
        Table({"a": [1], "b": []})


def test_json_lines_in_a_json_file_and_missing_keys(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n', encoding="utf-8")
    table = read_table(path)
    assert table["label"] == [1, None]


@pytest.mark.parametrize(
    "content,message",
    [
        (b"text,label\na,1,extra\n", "row 1 (line 2) has 3 fields where the header has 2; quote cells"),
        (b"text,text\na,b\n", "names column(s) ['text'] more than once; give every column its own name"),
        (b'[{"text": "a"}, 3]', "give a list of objects, or one object per line"),
    ],
)
def test_malformed_files_say_what_to_change(tmp_path, content, message):
    path = tmp_path / ("t.json" if content.startswith(b"[") else "t.csv")
    path.write_bytes(content)
    with pytest.raises(DataFileError, match="could not be read|names column") as info:
        read_table(path)
    assert message in str(info.value)


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes("\ufefftext,label\na,1\n".encode())
    assert read_table(path).column_names == ["text", "label"]


def test_reading_files_imports_neither_datasets_nor_pandas(tmp_path):
    path = write_rows(tmp_path / "t.csv", ROWS)
    code = (
        "import sys\n"
        "from far.data.files import load_text_files\n"
        f"load_text_files({str(path)!r}, {str(path)!r})\n"
        "print(sorted(m for m in ('datasets', 'pandas', 'pyarrow', 'evaluate') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
