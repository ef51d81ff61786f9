"""GLUE tasks as `datasets` splits, from a local GLUE folder or the hub, and their tokenisation.

Local data follows GLUE's download: `<dir>/<Task>/{train,dev}.tsv` (MNLI: `dev_matched.tsv`), tab-separated,
quoting off, a header row except CoLA's; `<dir>` is --data-dir / $FAR_DATA_DIR or its `glue/` subfolder. Either
source gives the hub's form (`nyu-mll/glue`: its text columns, `label`, `idx`), so one code path serves both.

    >>> splits = load_glue("cola", "../shared/data")
    >>> splits["train"][0]
    {'sentence': "Our friends won't buy this analysis, let alone the next one we propose.", 'label': 1, 'idx': 0}
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from far.data.files import tokenize_texts
from far.data.locate import find_local

# Imported where used: resident memory that a process reading no GLUE dataset never needs
# (docs/design.md, "Resident memory").
if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")


@dataclass(frozen=True)
class GlueTask:
    """How one GLUE task is laid out locally and on the hub.

    `tsv_columns` names, for each of the hub's `text_columns`, the local TSV's header field (or the
    field's position, for a file without a header); `label_column` likewise. `label_names` are the
    hub's class names in class-id order; empty for the regression task (stsb).
    """

    name: str
    folder: str
    text_columns: tuple[str, ...]
    tsv_columns: tuple[str | int, ...]
    label_column: str | int
    label_names: tuple[str, ...] = ()
    dev_file: str = "dev.tsv"
    hub_validation: str = "validation"

    @property
    def kind(self) -> str:
        return "classification" if self.label_names else "regression"

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    @property
    def header(self) -> bool:
        return isinstance(self.label_column, str)

    def split_file(self, split: str) -> str:
        return {"train": "train.tsv", "validation": self.dev_file}[split]


_PAIR = ("sentence1", "sentence2")
_ENTAILMENT = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        # CoLA has no header: source, label, original label, sentence.
        GlueTask("cola", "CoLA", ("sentence",), (3,), 1, ("unacceptable", "acceptable")),
        GlueTask("sst2", "SST-2", ("sentence",), ("sentence",), "label", ("negative", "positive")),
        GlueTask("mrpc", "MRPC", _PAIR, ("#1 String", "#2 String"), "Quality", ("not_equivalent", "equivalent")),
        GlueTask(
            "qqp",
            "QQP",
            ("question1", "question2"),
            ("question1", "question2"),
            "is_duplicate",
            ("not_duplicate", "duplicate"),
        ),
        GlueTask("stsb", "STS-B", _PAIR, _PAIR, "score"),
        GlueTask(
            "mnli",
            "MNLI",
            ("premise", "hypothesis"),
            _PAIR,
            "gold_label",
            ("entailment", "neutral", "contradiction"),
            dev_file="dev_matched.tsv",
            hub_validation="validation_matched",
        ),
        GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", _ENTAILMENT),
        GlueTask("rte", "RTE", _PAIR, _PAIR, "label", _ENTAILMENT),
        GlueTask("wnli", "WNLI", _PAIR, _PAIR, "label", ("not_entailment", "entailment")),
    )
}

_COLA_FIELDS = 4  # source, label, original label, sentence


def get_task(task: str) -> GlueTask:
    if task not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; choose one of {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[task]


def features(task: GlueTask) -> datasets.Features:
    import datasets

    label = datasets.ClassLabel(names=list(task.label_names)) if task.label_names else datasets.Value("float32")
    return datasets.Features(
        {**{c: datasets.Value("string") for c in task.text_columns}, "label": label, "idx": datasets.Value("int32")}
    )


def load_glue(
    task: str, data_dir: str | os.PathLike | None = None, splits: Sequence[str] = SPLITS
) -> datasets.DatasetDict:
    """Load GLUE `task`'s splits ("train", "validation") from a local GLUE folder, else from the hub.

    Args:
        task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte or wnli.
        data_dir: the folder holding `glue/<Task>/` or `<Task>/`; default $FAR_DATA_DIR. Without local
            files the hub's `nyu-mll/glue` is used, unless HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set.
        splits: which splits to return; "validation" is GLUE's dev set (MNLI: matched).

    Raises:
        ValueError: unknown task or split, or a file without the expected columns or labels.
        FileNotFoundError: no local data and the hub is offline, or a split file missing from the task's folder.
    """
    import datasets

    spec = get_task(task)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; GLUE splits here are {', '.join(SPLITS)}")
    folder = find_local(
        data_dir,
        "glue",
        spec.folder,
        what=f"GLUE {spec.folder} folder",
        hint=f"Point --data-dir or $FAR_DATA_DIR at a folder with glue/{spec.folder}/{{train.tsv,{spec.dev_file}}} "
        "(GLUE's download layout), or unset HF_DATASETS_OFFLINE to use the hub.",
    )
    if folder is None:
        return _load_from_hub(spec, splits)
    out = {}
    for split in splits:
        path = folder / spec.split_file(split)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; GLUE {spec.folder} needs train.tsv and {spec.dev_file} in {folder}"
            )
        out[split] = read_glue_tsv(path, spec)
    return datasets.DatasetDict(out)


def _load_from_hub(spec: GlueTask, splits: Sequence[str]) -> datasets.DatasetDict:
    import datasets

    loaded = datasets.load_dataset("nyu-mll/glue", spec.name)
    names = {"train": "train", "validation": spec.hub_validation}
    return datasets.DatasetDict({s: loaded[names[s]].cast(features(spec)) for s in splits})


def read_glue_tsv(path: str | os.PathLike, task: str | GlueTask) -> datasets.Dataset:
    """Read one GLUE TSV file (train or dev layout) into a `datasets.Dataset` in the hub's form.

    Rows with too few fields are skipped with a warning (GLUE's QQP has a few); a label outside the
    task's classes is an error that names the file and line. A UTF-8 byte order mark (GLUE's MRPC files
    start with one) is dropped.
    """
    import datasets

    spec = task if isinstance(task, GlueTask) else get_task(task)
    path = Path(path)
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise ValueError(f"{path} is empty; expected GLUE {spec.folder} data")
    wanted = (*spec.tsv_columns, spec.label_column)
    if spec.header:
        header, rows, first_line = rows[0], rows[1:], 2
        missing = [c for c in wanted if c not in header]
        if missing:
            raise ValueError(
                f"{path} has columns {header} but GLUE {spec.name} needs {missing}; "
                f"is it GLUE's {spec.folder} file (tab-separated, with a header row)?"
            )
        positions = [header.index(c) for c in wanted]
    else:
        first_line, positions = 1, list(wanted)
        if len(rows[0]) != _COLA_FIELDS or _parse_label(rows[0][spec.label_column], spec) is None:
            raise ValueError(
                f"{path} does not look like GLUE {spec.folder}: expected {_COLA_FIELDS} tab-separated fields without "
                f"a header (source, label, original label, sentence); line 1 is {rows[0][:_COLA_FIELDS]}"
            )
    columns: dict[str, list] = {c: [] for c in (*spec.text_columns, "label")}
    skipped, needed = 0, max(positions) + 1
    for line, row in enumerate(rows, start=first_line):
        if len(row) < needed:
            skipped += 1
            continue
        label = _parse_label(row[positions[-1]], spec)
        if label is None:
            allowed = (
                "a number"
                if spec.kind == "regression"
                else f"one of {list(spec.label_names)} or 0..{spec.num_labels - 1}"
            )
            raise ValueError(f"{path}:{line}: label {row[positions[-1]]!r} is not {allowed} (GLUE {spec.name})")
        for column, position in zip(spec.text_columns, positions[:-1], strict=True):
            columns[column].append(row[position])
        columns["label"].append(label)
    if skipped:
        logger.warning("%s: skipped %d row(s) with fewer than %d fields", path, skipped, needed)
    if not columns["label"]:
        raise ValueError(f"{path} has no usable rows for GLUE {spec.name}")
    columns["idx"] = list(range(len(columns["label"])))
    return datasets.Dataset.from_dict(columns, features=features(spec))


def _parse_label(value: str, spec: GlueTask) -> int | float | None:
    value = value.strip()
    if spec.kind == "regression":
        try:
            return float(value)
        except ValueError:
            return None
    if value in spec.label_names:
        return spec.label_names.index(value)
    if value.isdigit() and int(value) < spec.num_labels:
        return int(value)
    return None


def tokenize_glue(
    dataset: datasets.Dataset, tokenizer, task: str | GlueTask, max_length: int = 128
) -> datasets.Dataset:
    """Tokenise a GLUE split for the model: `input_ids`, `attention_mask` (...) and `labels`, nothing else.

    Sequences are truncated to `max_length` tokens but not padded: batches are padded to their
    longest member by `transformers.DataCollatorWithPadding` (dynamic padding).
    """
    spec = task if isinstance(task, GlueTask) else get_task(task)
    return tokenize_texts(dataset, tokenizer, spec.text_columns, max_length, desc=f"Tokenising {spec.name}")
