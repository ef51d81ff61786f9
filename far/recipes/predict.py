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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from transformers import AutoConfig, DataCollatorWithPadding

from far.data.files import DataFileError, as_dataset, read_texts, tokenize_texts
from far.data.glue import GLUE_TASKS
from far.evaluation.labels import model_outputs
from far.models import load_model_and_tokenizer, load_trained_model, resolve_model
from far.recipes.task_model import COLUMNS_KEY
from far.saving import learners_model_config, load_learners
from far.storage.atomic import atomic_file

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
            # The base with a head of the card's size and labels, which the file's tensors replace (so transformers'
            # report that the head is newly initialised is not shown).
            kind = "classification" if card.label_names else "regression"
            loaded, tokenizer = load_model_and_tokenizer(
                os.fspath(model), kind, card.head_size, label_names=card.label_names or None, head_replaced=True
            )
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
