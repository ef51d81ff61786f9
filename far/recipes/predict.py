"""Predictions from a fine-tuned model: one row per input with the label name and its score.

A model is a folder a training run saved (plain or FAR, e.g. `runs/reviews-minilm-far/model`), or a base
model plus a learners file (`learners=`), which must be the base the file was trained from. The
model's config says which text columns it reads (`far train` records them; a GLUE model reads its
task's), so a file to predict has the training run's column names.

    >>> texts = ["A warm, funny film.", "Two hours I will never get back."]
    >>> far.recipes.predict("runs/reviews-minilm-far/model", texts)
    [{'text': 'A warm, funny film.', 'label': 'positive', 'score': 0.97}, ...]
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from transformers import AutoConfig, DataCollatorWithPadding

from far.atomic import atomic_file
from far.data.files import DataFileError, as_dataset, read_texts, tokenize_texts
from far.data.glue import GLUE_TASKS
from far.evaluation.labels import model_outputs
from far.models import load_model_and_tokenizer, load_trained_model, resolve_model
from far.recipes.task_model import COLUMNS_KEY
from far.saving import LearnersFileError, active_learners, learners_model_config, load_learners, unload_learners

OUTPUT_FORMATS = (".csv", ".jsonl")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelCard:
    """What a predictor needs to know before loading any weights: the labels and the text columns."""

    label_names: tuple[str, ...]  # class names in id order; empty for regression
    text_columns: tuple[str, ...]  # empty: not recorded (a file's are then found as `far train` finds them)

    @classmethod
    def from_config(cls, config: Mapping) -> ModelCard:
        """From a Hugging Face config as a dict (`config.json`, or a learners file's `model_config`).

        A dict that leaves out the labels (`to_diff_dict` does, at transformers' defaults) has
        transformers' default head: `num_labels` (default 2) classes named LABEL_0, LABEL_1, ...
        """
        names = _class_names(config)
        regression = config.get("problem_type") == "regression" or len(names) == 1
        names = () if regression else names
        recorded = (config.get(COLUMNS_KEY) or {}).get("text")
        task = GLUE_TASKS.get(config.get("finetuning_task") or "")
        columns = tuple(recorded) if recorded else task.text_columns if task is not None else ()
        return cls(names, columns)

    @property
    def head_size(self) -> int:
        """The head's outputs: one per class, one for regression."""
        return len(self.label_names) or 1

    @property
    def names_classes(self) -> bool:
        """Whether the classes have names: False for transformers' placeholders LABEL_0, LABEL_1, ..."""
        return self.label_names != _placeholder_names(len(self.label_names))

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The columns of texts given as a list or as lines: the recorded ones, else one called "text"."""
        return self.text_columns or ("text",)


def _placeholder_names(n: int) -> tuple[str, ...]:
    """The names transformers gives `n` classes that were given none."""
    return tuple(f"LABEL_{i}" for i in range(n))


def _class_names(config: Mapping) -> tuple[str, ...]:
    """The class names of a config dict in id order; transformers' defaults where it records none."""
    id2label = config.get("id2label")
    if not id2label:
        return _placeholder_names(int(config.get("num_labels") or transformers.PretrainedConfig().num_labels))
    return tuple(str(id2label[k]) for k in sorted(id2label, key=int))


def model_card(model: str | os.PathLike, learners: str | os.PathLike | None = None) -> ModelCard:
    """The labels and text columns of a saved model, or of a learners file's model; no weights are loaded.

    A learners file's card is the file's own, from the config it records (the base's if it records
    none): its head's size and class names never come from another file.

    Raises:
        ValueError: not a model folder or alias; `LearnersFileError` for a bad learners file.
    """
    if learners is not None:
        config = learners_model_config(learners)
        if config:
            return ModelCard.from_config(config)
    try:
        config = AutoConfig.from_pretrained(resolve_model(model))
    except (OSError, ModuleNotFoundError) as e:
        raise ValueError(f"could not read the configuration of model {str(model)!r}: {e}") from None
    return ModelCard.from_config(config.to_dict())


def _base_for(
    model: str | os.PathLike, card: ModelCard
) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase]:
    """The base model with a head of the card's size and labels, to receive a learners file (which
    replaces that head: transformers' report that it is newly initialised is not shown)."""
    kind = "classification" if card.label_names else "regression"
    return load_model_and_tokenizer(
        os.fspath(model), kind, card.head_size, label_names=card.label_names or None, head_replaced=True
    )


def note_label_ids(learners: str | os.PathLike, card: ModelCard) -> None:
    """Say (a warning) that a learners file names no classes, so its predictions are label ids."""
    if card.label_names and not card.names_classes:
        logger.warning(
            "%s records no label names (saved from a model built without them): its predictions are the label "
            "ids %s; train with far train, or build the model with label_names=..., to predict names",
            learners,
            ", ".join(card.label_names),
        )


class Predictor:
    """A loaded model, its tokenizer and its card; call it on rows of text.

    Example:
        >>> predictor = Predictor.load("runs/reviews-minilm-far/model")
        >>> predictor(["Loved it."])
        [{'text': 'Loved it.', 'label': 'positive', 'score': 0.98}]
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: transformers.PreTrainedTokenizerBase,
        card: ModelCard,
        *,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> None:
        self.model, self.tokenizer, self.card = model.eval(), tokenizer, card
        self.max_length, self.batch_size = max_length, batch_size

    @classmethod
    def load(
        cls,
        model: str | os.PathLike,
        *,
        learners: str | os.PathLike | None = None,
        card: ModelCard | None = None,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> Predictor:
        """Load a saved model folder, or a base model (folder or alias) with a learners file applied.

        With a learners file, the base gets the head the file records (`card`, read from the file if
        not given), which the file's tensors then replace.

        Raises:
            ValueError: a model that cannot be loaded; `LearnersFileError` (a ValueError) for a
                learners file that is damaged or belongs to another base model.
        """
        card = model_card(model, learners) if card is None else card
        if learners is None:
            loaded, tokenizer = load_trained_model(model)
        else:
            loaded, tokenizer = _base_for(model, card)
            load_learners(loaded, learners)  # checks the file belongs to this base, before anything is written
            note_label_ids(learners, card)
        return cls(loaded, tokenizer, card, max_length=max_length, batch_size=batch_size)

    def rows(self, inputs: Sequence[str | Sequence[str] | Mapping[str, str]]) -> datasets.Dataset:
        """Inputs as a dataset of the model's text columns: texts, (text, text) pairs, or dicts."""
        columns = self.card.input_columns
        table: dict[str, list[str]] = {c: [] for c in columns}
        for i, item in enumerate(inputs, start=1):
            if isinstance(item, Mapping):
                missing = [c for c in columns if c not in item]
                if missing:
                    raise DataFileError(f"input {i} has no {missing}; the model reads the column(s) {list(columns)}")
                values = [item[c] for c in columns]
            else:
                values = [item] if isinstance(item, str) else list(item)
            if len(values) != len(columns):
                raise DataFileError(
                    f"input {i} has {len(values)} text(s) but the model reads {len(columns)} ({list(columns)}); "
                    + ("give each input as a pair of texts" if len(columns) == 2 else "give one text per input")
                )
            for column, value in zip(columns, values, strict=True):
                table[column].append(str(value))
        if not table[columns[0]]:
            raise DataFileError("there is nothing to predict: no input rows")
        return datasets.Dataset.from_dict(table)

    def __call__(self, inputs: Sequence[str | Sequence[str] | Mapping[str, str]] | datasets.Dataset) -> list[dict]:
        """One dict per input: its texts, `label` (the class name; None for regression) and `score`
        (the class's probability; the predicted value for regression)."""
        rows = inputs if isinstance(inputs, datasets.Dataset) else self.rows(inputs)
        columns = self.card.text_columns or tuple(rows.column_names)
        encoded = tokenize_texts(rows, self.tokenizer, columns, self.max_length)
        collate = DataCollatorWithPadding(self.tokenizer)
        logits = torch.cat(
            [out.logits.float() for _, out in model_outputs(self.model, encoded, collate, self.batch_size, False)]
        )
        results = []
        if self.card.label_names:
            probabilities = logits.softmax(-1)  # (N, num_labels)
            scores, ids = probabilities.max(-1)
            labels = [self.card.label_names[i] for i in ids.tolist()]
        else:
            scores, labels = logits[:, 0], [None] * len(logits)
        for i, (label, score) in enumerate(zip(labels, scores.tolist(), strict=True)):
            results.append({**{c: rows[i][c] for c in columns}, "label": label, "score": score})
        return results


def read_inputs(source: str | os.PathLike | io.TextIOBase, text_columns: Sequence[str]) -> datasets.Dataset:
    """Texts to predict: a CSV/TSV/JSON/JSONL file with the model's text columns, or a stream of lines
    (one text per line; a pair as two tab-separated texts). Without `text_columns` a file's are found
    as `far train` finds them, and lines are one column, "text"."""
    if not isinstance(source, io.TextIOBase):
        return as_dataset(read_texts(source, text_columns or None))
    text_columns = text_columns or ("text",)
    table: dict[str, list[str]] = {c: [] for c in text_columns}
    for number, line in enumerate(source, start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        values = line.split("\t") if len(text_columns) == 2 else [line]
        if len(values) != len(text_columns):
            raise DataFileError(
                f"line {number} of the input has {len(values)} tab-separated text(s); the model reads pairs "
                f"({list(text_columns)}): give two texts per line, separated by a tab"
            )
        for column, value in zip(text_columns, values, strict=True):
            table[column].append(value)
    if not table[text_columns[0]]:
        raise DataFileError("the input has no text lines; give one text per line")
    return datasets.Dataset.from_dict(table)


def check_output(path: str | os.PathLike) -> Path:
    """The output path, checked before anything runs: a .csv or .jsonl file in a folder that can hold it."""
    path = Path(path)
    if path.suffix.lower() not in OUTPUT_FORMATS:
        raise ValueError(f"--output {str(path)!r}: name a file ending in {' or '.join(OUTPUT_FORMATS)}")
    if path.is_dir():
        raise ValueError(f"--output {str(path)!r} is a folder; name a {' or '.join(OUTPUT_FORMATS)} file")
    return path


def format_rows(rows: Iterable[Mapping], suffix: str) -> str:
    """Rows as CSV (header first) or JSON Lines text."""
    rows = list(rows)
    if suffix.lower() == ".jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return buffer.getvalue()


def write_predictions(rows: Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write prediction rows to a .csv or .jsonl file, atomically (whole or not at all)."""
    path = check_output(path)
    text = format_rows(rows, path.suffix)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def learners_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The learners files named: files, and folders of `*.safetensors` files (sorted); each user once.

    Raises:
        ValueError: a path that does not exist, an empty folder, or two files of the same name
            (their predictions would go to the same output file).
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("*.safetensors"))
            if not found:
                raise ValueError(f"--learners {str(path)!r} is a folder with no .safetensors file in it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"--learners {str(path)!r}: no such file or folder")
    stems = [f.stem for f in files]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"learners files share the name(s) {twice}: each user's predictions go to <name>.<format>")
    return files


@dataclass(frozen=True)
class UsersPredictions:
    """What `predict_users` did for each learners file: written, or skipped and why."""

    written: dict[Path, dict]  # output file -> {"rows": n, "swap_seconds": None for a freshly loaded base}
    failed: dict[Path, str]  # learners file -> why it was skipped (no output was written for it)


def user_output(output_dir: str | os.PathLike, learners: str | os.PathLike, suffix: str) -> Path:
    """Where a user's predictions go: `<output_dir>/<learners file stem><suffix>`."""
    return Path(output_dir) / f"{Path(learners).stem}{suffix}"


def _rows_by_columns(
    inputs: datasets.Dataset | Sequence | str | os.PathLike | io.TextIOBase,
) -> Callable[[ModelCard], datasets.Dataset | Sequence]:
    """A function from a user's card to the inputs as rows: a file or stream is read (once per set of
    text columns, a stream held in memory) with the columns that user's model reads."""
    if not isinstance(inputs, (str, os.PathLike, io.TextIOBase)):
        return lambda card: inputs  # texts or a dataset: each predictor reads them as its card says
    text = inputs.read() if isinstance(inputs, io.TextIOBase) else None
    read: dict[tuple[str, ...], datasets.Dataset] = {}

    def rows(card: ModelCard) -> datasets.Dataset:
        if card.text_columns not in read:
            source = inputs if text is None else io.StringIO(text)
            read[card.text_columns] = read_inputs(source, card.text_columns)
        return read[card.text_columns]

    return rows


def _needs_base(predictor: Predictor | None, card: ModelCard) -> bool:
    """Whether a user's file needs the base loaded afresh: no predictor yet, or a head of another size."""
    return predictor is None or predictor.card.head_size != card.head_size


def _hold(predictor: Predictor | None, model: str | os.PathLike, path: Path, card: ModelCard, **sizes) -> Predictor:
    """A predictor holding `path`'s learners file and nothing of any other user's.

    The file swaps in place for the one `predictor` holds when their heads have the same size (where
    the two cannot swap, one splitting attention heads and the other not, the held one is taken off
    first); otherwise the base is loaded afresh with the file's head. Either way the file is judged
    against the base alone. A refused file raises; `predictor` then holds the previous user or the
    bare base, so it must take another file before it predicts.
    """
    if _needs_base(predictor, card):
        return Predictor.load(model, learners=path, card=card, **sizes)
    try:
        load_learners(predictor.model, path)
    except LearnersFileError:
        if active_learners(predictor.model) is None:
            raise
        unload_learners(predictor.model)  # the base alone: the file's verdict is then its own
        load_learners(predictor.model, path)
    predictor.card = card
    note_label_ids(path, card)
    return predictor


# What skips one user and not the others: its file refused or gone, inputs its model cannot read.
USER_ERRORS = (LearnersFileError, DataFileError, OSError)


def predict_users(
    model: str | os.PathLike,
    learners: Sequence[str | os.PathLike],
    inputs: datasets.Dataset | Sequence[str | Sequence[str] | Mapping[str, str]] | str | os.PathLike | io.TextIOBase,
    *,
    output_dir: str | os.PathLike,
    suffix: str = ".jsonl",
    max_length: int = 128,
    batch_size: int = 64,
) -> UsersPredictions:
    """Each user's predictions from one process: the base loads once (again only for a head of another
    size) and every learners file is swapped in place.

    `far.load_learners` replaces the active user's tensors with the next user's (memory stays at the
    base plus one file). Each file stands on its own: its head's size and labels and its text
    columns come from the file (a file with a head of another size gets the base afresh), so every
    user's predictions are the same in any order. A file that is refused (another base, damaged) or
    whose model cannot read the inputs is skipped, with its reason in the result; every other
    user's predictions are written, `user_output(output_dir, file, suffix)` each, whole or not at all.

    Args:
        inputs: Texts (or a dataset), or a CSV/TSV/JSON/JSONL file or a text stream, read with
            each user's text columns.

    Returns:
        A `UsersPredictions`: `written[output file] = {"rows": n, "swap_seconds": time to put this
        user's file in place, None where the base was loaded for it}`, `failed[learners file] = reason`.
    """
    if suffix not in OUTPUT_FORMATS:
        raise ValueError(f"the output format is one of {', '.join(OUTPUT_FORMATS)}, got {suffix!r}")
    files = learners_files(learners)
    rows_for = _rows_by_columns(inputs)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    predictor, written, failed = None, {}, {}
    for path in files:
        try:
            card = model_card(model, path)
            fresh, started = _needs_base(predictor, card), time.perf_counter()
            predictor = None if fresh else predictor  # one model in memory at a time
            predictor = _hold(predictor, model, path, card, max_length=max_length, batch_size=batch_size)
            seconds = None if fresh else time.perf_counter() - started
            results = predictor(rows_for(card))
        except USER_ERRORS as error:
            failed[path] = str(error)
            continue
        out = write_predictions(results, user_output(output_dir, path, suffix))
        written[out] = {"rows": len(results), "swap_seconds": seconds}
    return UsersPredictions(written, failed)


def predict(
    model: str | os.PathLike,
    inputs: Sequence[str | Sequence[str] | Mapping[str, str]] | str | os.PathLike,
    *,
    learners: str | os.PathLike | None = None,
    output: str | os.PathLike | None = None,
    max_length: int = 128,
    batch_size: int = 64,
) -> list[dict]:
    """Predict labels for texts with a fine-tuned model, in one call.

    Args:
        model: A model folder a training run saved (e.g. "runs/reviews-minilm-far/model"), or with
            `learners` the base model (folder or alias) that learners file was trained from.
        inputs: A list of texts (pairs as tuples, or dicts by column), or the path of a
            CSV/TSV/JSON/JSONL file with the model's text columns.
        learners: A learners file (`far.save_learners`, a run's learners.safetensors).
        output: Also write the rows to this .csv or .jsonl file.
        max_length / batch_size: Tokens per text (longer ones are truncated); texts per forward pass.

    Returns:
        One dict per input: its texts, `label` (class name; None for regression) and `score`
        (that class's probability; the value for regression).

    Raises:
        ValueError (`DataFileError`, `LearnersFileError`): bad inputs, model or learners file;
        raised before any file is written.

    Example:
        >>> predict("runs/reviews-minilm-far/model", ["What a lovely film.", "Dull and far too long."])
        [{'text': 'What a lovely film.', 'label': 'positive', 'score': 0.96}, ...]
    """
    if output is not None:
        check_output(output)
    card = model_card(model, learners)
    if isinstance(inputs, (str, os.PathLike)):
        if isinstance(inputs, str) and not Path(inputs).suffix:
            raise TypeError("inputs is a list of texts or the path of a file; for one text pass [text]")
        rows = read_inputs(inputs, card.text_columns)
    else:
        rows = None
    predictor = Predictor.load(model, learners=learners, card=card, max_length=max_length, batch_size=batch_size)
    results = predictor(rows if rows is not None else inputs)
    if output is not None:
        write_predictions(results, output)
    return results
