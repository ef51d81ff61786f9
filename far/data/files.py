"""Your own data: CSV, TSV, JSON and JSONL files read (`far.data.table`), checked, labels mapped to ids.

The shape `transformers`' run_glue.py users know: a training and a validation file with one or two
text columns and a label column. By default the label column is `label` and the text columns are
`sentence1` and `sentence2` when both exist, else the only other column, else `sentence` or `text`,
else the first two other columns (run_glue's rule; id columns such as `idx` are skipped).

Labels: text (`positive`) or whole numbers (`0`, `3`) are classes, mapped to ids in sorted order;
numbers with a fraction (`3.5`, `1.0`) mean regression. Every mistake in the files (a missing
column, an empty or non-UTF-8 file, a validation label never seen in training, labels that mix
text and numbers) is a `DataFileError` that says what to do, raised before any model is loaded.

    >>> data = load_text_files("examples/reviews/train.csv", "examples/reviews/dev.csv")
    >>> data.text_columns, data.labels.names
    (('text',), ('negative', 'positive'))
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from far.data.mapping import map_batches
from far.data.table import DataFileError, Table, read_table

logger = logging.getLogger(__name__)

DEFAULT_LABEL_COLUMN = "label"
_ID_COLUMNS = ("idx", "id", "index")  # never taken for text by default


@dataclass(frozen=True)
class LabelSpace:
    """The labels of a run: class names in id order, or none for regression."""

    names: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "classification" if self.names else "regression"

    @property
    def num_labels(self) -> int:
        return len(self.names) or 1

    def encode(self, value: object) -> int | float:
        return self.names.index(_label_text(value)) if self.names else float(value)


@dataclass(frozen=True)
class TextFiles:
    """A training and a validation file, read and checked: text columns (strings) and `label` (id or value)."""

    name: str
    train: Table
    validation: Table
    text_columns: tuple[str, ...]
    label_column: str
    labels: LabelSpace


def _require_columns(path: Path, columns: Sequence[str], wanted: Sequence[str], fix: str) -> None:
    for column in wanted:
        if column not in columns:
            close = difflib.get_close_matches(column, columns, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise DataFileError(f"{path} has no column {column!r}; its columns are: {', '.join(columns)}. {hint}{fix}")


def resolve_text_columns(
    path: str | os.PathLike,
    columns: Sequence[str],
    text_columns: Sequence[str] | None = None,
    label_column: str | None = DEFAULT_LABEL_COLUMN,
) -> tuple[str, ...]:
    """The text columns of a file with `columns`: the ones given (checked), or run_glue's defaults."""
    path, columns = Path(path), list(columns)
    if text_columns:
        if not 1 <= len(text_columns) <= 2:
            raise DataFileError(f"give one or two text columns (a sentence or a pair), got {list(text_columns)}")
        _require_columns(path, columns, text_columns, "Pass --text-column with one or two of them.")
        return tuple(text_columns)
    others = [c for c in columns if c != label_column and c.lower() not in _ID_COLUMNS]
    if "sentence1" in others and "sentence2" in others:
        return ("sentence1", "sentence2")
    if len(others) == 1:
        return (others[0],)
    for name in ("sentence", "text"):
        if name in others:
            return (name,)
    if len(others) >= 2:
        return tuple(others[:2])
    raise DataFileError(
        f"{path} has no column to read text from (its columns: {', '.join(columns)}); pass --text-column"
    )


def _label_text(value: object) -> str:
    return value.strip() if isinstance(value, str) else str(value)


def _label_type(value: object) -> str | None:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN: missing
        return None
    if isinstance(value, (int, float)):
        return "str" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
    text = _label_text(value)
    if not text:
        return None
    for kind, parse in (("int", int), ("float", float)):
        try:
            parse(text)
        except ValueError:
            continue
        return kind
    return "str"


def _label_types(path: Path, labels: Sequence, column: str) -> dict[str, tuple[int, object]]:
    found: dict[str, tuple[int, object]] = {}
    for row, value in enumerate(labels, start=1):
        kind = _label_type(value)
        if kind is None:
            raise DataFileError(f"{path}: row {row} has no label in column {column!r}; give every example a label")
        found.setdefault(kind, (row, value))
    return found


def label_space(files: Sequence[tuple[Path, Sequence]], column: str) -> LabelSpace:
    """The labels of a run from its (file, labels) pairs, training file first; checked (`DataFileError`)."""
    types = {path: _label_types(path, labels, column) for path, labels in files}
    every = {kind: (path, *where) for path, found in types.items() for kind, where in found.items()}
    if "str" in every and len(every) > 1:
        number = every.get("int") or every["float"]
        text = every["str"]
        raise DataFileError(
            f"the labels mix text and numbers: {text[2]!r} ({text[0]}, row {text[1]}) and {number[2]!r} "
            f"({number[0]}, row {number[1]}); make every label a class name, or every label a number"
        )
    if "float" in every:
        for path, labels in files:  # "nan", "inf" or 1e999 parse as floats, and train a model on NaN
            row = next((i for i, v in enumerate(labels, start=1) if not math.isfinite(float(_label_text(v)))), None)
            if row is not None:
                raise DataFileError(
                    f"{path}: row {row}'s label {labels[row - 1]!r} in column {column!r} is no finite number; "
                    "give every example of a regression task a finite number"
                )
        return LabelSpace()  # regression
    (train_path, train_labels), *others = files
    as_number = "int" in every
    classes = sorted({_label_text(v) for v in train_labels}, key=lambda v: int(v) if as_number else v)
    if len(classes) < 2:
        raise DataFileError(
            f"{train_path} has a single class ({classes[0]!r}); classification needs examples of at least two"
        )
    known = set(classes)
    for path, labels in others:
        unseen = sorted({_label_text(v) for v in labels} - known)
        if unseen:
            row = next(i for i, v in enumerate(labels, start=1) if _label_text(v) in unseen)
            raise DataFileError(
                f"{path}: label(s) {unseen} (first at row {row}) never occur in the training file {train_path}, "
                f"whose classes are {classes}; the model cannot learn them: add training examples or drop those rows"
            )
    return LabelSpace(tuple(classes))


def _examples(path: Path, table: Table, text_columns: Sequence[str], labels: LabelSpace | None, label: str) -> Table:
    columns: dict[str, list] = {}
    for column in text_columns:
        values = table[column]
        for row, value in enumerate(values, start=1):
            if value is None:
                raise DataFileError(f"{path}: row {row} has no text in column {column!r}")
        columns[column] = [v if isinstance(v, str) else str(v) for v in values]
    if labels is not None:
        columns["label"] = [labels.encode(v) for v in table[label]]
    return Table(columns)


def as_dataset(table: Table, labels: LabelSpace | None = None):
    """`table` as the `datasets.Dataset` the transformers path tokenises: text columns as strings, and
    `label` as a `ClassLabel` of `labels.names` (a float for regression) when the table has labels."""
    import datasets  # here only: reading and checking files never needs it

    if labels is None or "label" not in table.column_names:
        return table.to_dataset()
    text = {c: datasets.Value("string") for c in table.column_names if c != "label"}
    label = datasets.ClassLabel(names=list(labels.names)) if labels.names else datasets.Value("float32")
    return table.to_dataset(datasets.Features({**text, "label": label}))


def load_text_files(
    train_file: str | os.PathLike,
    validation_file: str | os.PathLike,
    *,
    text_columns: Sequence[str] | None = None,
    label_column: str = DEFAULT_LABEL_COLUMN,
) -> TextFiles:
    """Read and check a training and a validation file (CSV, TSV, JSON or JSONL; they may differ).

    Args:
        train_file / validation_file: The examples to train on and to score.
        text_columns: One or two column names (a sentence, or a pair); default run_glue's choice.
        label_column: The column of the labels (default "label").

    Returns:
        `TextFiles` with the columns, the label space and both splits ready to tokenise.

    Raises:
        DataFileError: anything wrong with the files; nothing has been loaded or written yet.
    """
    paths = (Path(train_file), Path(validation_file))
    tables = [read_table(p) for p in paths]
    train_columns = tables[0].column_names
    _require_columns(paths[0], train_columns, [label_column], "Pass --label-column with one of them.")
    texts = resolve_text_columns(paths[0], train_columns, text_columns, label_column)
    wanted = [*texts, label_column]
    _require_columns(paths[1], tables[1].column_names, wanted, f"Give it the training file's columns {wanted}.")
    labels = label_space([(p, t[label_column]) for p, t in zip(paths, tables, strict=True)], label_column)
    train, validation = (_examples(p, t, texts, labels, label_column) for p, t in zip(paths, tables, strict=True))
    name = run_name(paths[0])
    logger.info(
        "%s: %d training / %d validation examples, text %s, %s",
        name,
        len(train),
        len(validation),
        list(texts),
        f"classes {list(labels.names)}" if labels.names else "regression",
    )
    return TextFiles(name, train, validation, texts, label_column, labels)


def run_name(train_file: Path) -> str:
    """A run's name from its training file: `reviews.csv` -> "reviews", `reviews/train.csv` -> "reviews"."""
    generic = train_file.stem.lower() in ("train", "training", "data")
    return train_file.resolve().parent.name if generic and train_file.resolve().parent.name else train_file.stem


def read_texts(path: str | os.PathLike, text_columns: Sequence[str] | None) -> Table:
    """The texts of a file to predict: its `text_columns` (as strings; None: found as for training);
    other columns are ignored."""
    path = Path(path)
    table = read_table(path)
    text_columns = text_columns or resolve_text_columns(path, table.column_names)
    fix = f"Give it the column(s) the model was trained on: {list(text_columns)}."
    _require_columns(path, table.column_names, text_columns, fix)
    return _examples(path, table, text_columns, None, DEFAULT_LABEL_COLUMN)


def tokenize_texts(dataset, tokenizer, text_columns: Sequence[str], max_length: int = 128, *, desc: str = "Tokenising"):
    """`input_ids`, `attention_mask` (...) and, when the dataset has `label`, `labels`; nothing else.
    Truncated to `max_length` tokens, not padded (`DataCollatorWithPadding` pads each batch)."""
    if max_length < 8:
        raise ValueError(f"max_length must be at least 8 tokens, got {max_length}")
    has_labels = "label" in dataset.column_names

    def encode(batch: dict[str, list]) -> dict[str, list]:
        encoded = tokenizer(*[batch[c] for c in text_columns], truncation=True, max_length=max_length)
        if has_labels:
            encoded["labels"] = batch["label"]
        return encoded

    return map_batches(dataset, encode, remove_columns=dataset.column_names, desc=desc)
