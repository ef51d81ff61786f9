"""A data file's rows as columns, read with the standard library: CSV, TSV, JSON and JSON Lines.

`read_table` does what `datasets.load_dataset("csv" | "json", ...)` does, without importing `datasets`
(pandas and pyarrow, resident before a row is read: docs/design.md, "Resident memory"). CSV/TSV cells
stay strings ("NA" is text), JSON values keep their types. `Table` has the `datasets.Dataset`
operations a run uses, with the same results, so a run's splits do not depend on the path that read it.

    >>> table = read_table("examples/reviews/train.csv")
    >>> table.column_names, len(table)
    (['text', 'label'], 40)
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

FORMATS = (".csv", ".tsv", ".json", ".jsonl")


class DataFileError(ValueError):
    """A data file that cannot be used as it is; the message names the file and what to change."""


class Table:
    """Columns of equal length: `{name: [value per row]}`, in the file's column order."""

    def __init__(self, columns: Mapping[str, Sequence]) -> None:
        self.columns = {name: list(values) for name, values in columns.items()}
        lengths = {len(values) for values in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"the columns of a table must have one length, got {sorted(lengths)}")
        self._length = lengths.pop() if lengths else 0

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, name: str) -> list:
        return self.columns[name]

    def select(self, indices: Iterable[int]) -> Table:
        """The rows at `indices`, in that order."""
        indices = list(indices)
        return Table({name: [values[i] for i in indices] for name, values in self.columns.items()})

    def train_test_split(self, test_size: float, seed: int) -> dict[str, Table]:
        """`{"train": ..., "test": ...}`: `test_size` of the rows (rounded up) drawn with `seed`, as
        `datasets.Dataset.train_test_split(test_size=..., seed=...)` draws them (numpy's PCG64 permutation)."""
        if not 0 < test_size < 1:
            raise ValueError(f"test_size must be a fraction in (0, 1), got {test_size!r}")
        n_test = math.ceil(test_size * len(self))
        permutation = np.random.default_rng(seed).permutation(len(self))
        return {"train": self.select(permutation[n_test:].tolist()), "test": self.select(permutation[:n_test].tolist())}

    def to_dataset(self, features=None):
        """The same rows as a `datasets.Dataset` (imported here, so that reading a table never imports it)."""
        import datasets

        return datasets.Dataset.from_dict(self.columns, features=features)


def _csv_rows(path: Path, text: str) -> tuple[list[str], list[list[str]]]:
    tsv = path.suffix.lower() == ".tsv"
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    reader = csv.reader(io.StringIO(text, newline=""), **options)
    try:
        rows = [row for row in reader if row]  # blank lines are no rows
    except csv.Error as e:
        kind = path.suffix.lstrip(".").upper()
        raise DataFileError(f"{path} could not be read as {kind}: line {reader.line_num}: {e}") from None
    if not rows:
        raise DataFileError(f"{path} is empty; it needs a header row (for CSV/TSV) and at least one example")
    header, body = rows[0], rows[1:]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise DataFileError(
            f"{path}: the header names column(s) {repeated} more than once; give every column its own name"
        )
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataFileError(
                f"{path} could not be read as {path.suffix.lstrip('.').upper()}: row {line - 1} (line {line}) has "
                f"{len(row)} fields where the header has {len(header)}; quote cells that hold the separator"
            )
    return header, body


def _object(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys):  # json keeps the last silently: which value the file meant is unknown
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        raise ValueError(f"an object names key(s) {repeated[:5]} more than once; give each key once")
    return dict(pairs)


def _constant(name: str) -> float:
    raise ValueError(f"{name} is no JSON number; write the value as a number or a string")


def _json_records(path: Path, text: str) -> list[dict]:
    stripped = text.lstrip()
    strict = {"object_pairs_hook": _object, "parse_constant": _constant}
    try:
        if path.suffix.lower() == ".json" and stripped.startswith("["):
            records = json.loads(text, **strict)
        else:  # JSON Lines (also accepted in a .json file, as datasets does)
            records = [json.loads(line, **strict) for line in text.splitlines() if line.strip()]
    except RecursionError:
        raise DataFileError(f"{path} could not be read as JSON: it nests arrays or objects too deeply") from None
    except ValueError as e:  # JSONDecodeError, and numbers of more digits than Python converts
        raise DataFileError(f"{path} could not be read as JSON: {type(e).__name__}: {str(e)[:300]}") from None
    if not all(isinstance(record, dict) for record in records):
        raise DataFileError(f"{path} could not be read as JSON: give a list of objects, or one object per line")
    return records


def read_table(path: str | os.PathLike) -> Table:
    """One CSV, TSV, JSON or JSONL file as a `Table`, or a `DataFileError` saying what is wrong.

    TSV is read with quoting off (as GLUE's files need); CSV with the usual double quotes. A JSON
    file is a list of objects, or one object per line; a key missing from some objects is None there.
    """
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise DataFileError(f"{path}: unknown format {path.suffix!r}; use a file ending in {', '.join(FORMATS)}")
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise DataFileError(f"{path} {why}; pass the path of a {', '.join(FORMATS)} file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataFileError(f"{path} cannot be read ({e.strerror}); check its permissions") from None
    if not raw.strip():
        raise DataFileError(f"{path} is empty; it needs a header row (for CSV/TSV) and at least one example")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataFileError(
            f"{path} is not UTF-8 text (byte {raw[e.start]:#04x} on line {line}); save it as UTF-8, "
            f"e.g. `iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`"
        ) from None
    if path.suffix.lower() in (".csv", ".tsv"):
        header, body = _csv_rows(path, text)
        if not body:
            raise DataFileError(f"{path} has a header but no rows; add at least one example")
        return Table({name: [row[i] for row in body] for i, name in enumerate(header)})
    records = _json_records(path, text)
    if not records:
        raise DataFileError(f"{path} has no rows; add at least one example")
    names = list(dict.fromkeys(key for record in records for key in record))
    return Table({name: [record.get(name) for record in records] for name in names})
