"""Scoring a model on labelled examples (classes or scores): batched predictions -> metrics, kept to write out.

Works on any sequence of tokenised examples (a list of dicts or a `datasets.Dataset`) and imports
neither `datasets` nor `evaluate`: a run under a memory budget evaluates with it as it is.

    >>> evaluator = LabelEvaluator(dev, collate, label_names=("neg", "pos"), metric=TextMetric("classification"))
    >>> evaluator(model)
    {'accuracy': 0.85, 'macro_f1': 0.84}
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from far.evaluation import scores
from far.storage.atomic import atomic_file

LABELS_FILE = "predictions.tsv"  # GLUE-style tasks: one row per example


def column(examples, name: str) -> list:
    """One field of every example: a `datasets.Dataset` column, or the field of each dict in a list."""
    return examples[name] if hasattr(examples, "column_names") else [example[name] for example in examples]


def write_label_predictions(
    path: str | os.PathLike, idx: Sequence[int], predictions: Sequence, labels: Sequence, names: Sequence[str]
) -> None:
    """TSV `index  prediction  label`, as run_glue.py's predict file: class names, or scores (no `names`)."""

    def shown(value) -> str:
        return f"{value:.4f}" if not names else names[int(value)]

    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "prediction", "label"])
        for i, prediction, label in zip(idx, predictions, labels, strict=True):
            writer.writerow([i, shown(prediction), shown(label)])


def model_outputs(
    model: torch.nn.Module, dataset: Sequence, collate_fn: Callable, batch_size: int, bf16: bool
) -> Iterator[tuple[dict, object]]:
    """(batch, model output) over `dataset` in order, in eval mode, no_grad, optionally under bf16 autocast."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn):
                batch = {k: v.to(device) for k, v in batch.items()}
                yield batch, model(**batch)
    finally:
        model.train(was_training)


class TextMetric:
    """The default metrics of a run on the user's own files: accuracy and macro-F1, or Pearson and Spearman.

    Example:
        >>> TextMetric("classification").compute(predictions=[0, 1, 1], references=[0, 1, 0])
        {'accuracy': 0.666..., 'macro_f1': 0.666...}
    """

    def __init__(self, kind: str) -> None:
        if kind not in ("classification", "regression"):
            raise ValueError(f"kind must be 'classification' or 'regression', got {kind!r}")
        self.kind = kind

    def compute(self, *, predictions, references) -> dict[str, float]:
        if self.kind == "regression":
            return {
                "pearson": scores.pearson(predictions, references),
                "spearmanr": scores.spearman(predictions, references),
            }
        return {
            "accuracy": scores.accuracy(predictions, references),
            "macro_f1": scores.f1(predictions, references, average="macro"),
        }


class LabelEvaluator:
    """Scores a tokenised split with `labels` (class ids, or values when `label_names` is empty).

    Args:
        dataset: Model inputs and `labels` (`tokenize_glue`, `tokenize_texts`).
        collate_fn: Pads a batch (e.g. `DataCollatorWithPadding(tokenizer)`).
        label_names: Class names in id order; empty for regression.
        metric: Anything with `compute(predictions=..., references=...) -> dict` (an `evaluate` module).
        idx: The examples' indices for the predictions file; default 0..N-1.

    `predictions` holds the last run's class ids (or values).
    """

    def __init__(
        self,
        dataset: Sequence,
        collate_fn: Callable,
        *,
        label_names: Sequence[str],
        metric,
        batch_size: int = 64,
        bf16: bool = False,
        idx: Sequence[int] | None = None,
    ) -> None:
        self.label_names, self.metric = tuple(label_names), metric
        self.collate_fn, self.batch_size, self.bf16 = collate_fn, batch_size, bf16
        self.idx = list(range(len(dataset))) if idx is None else list(idx)
        self.references = np.asarray(column(dataset, "labels"))
        self.dataset = dataset
        # Batches of similar lengths pad little: a dev split in its own order pads each batch to its longest
        # example (SST-2's dev set: 2.0x the tokens). Sorted once; each evaluation puts the logits back in order.
        self.order = np.argsort([len(ids) for ids in column(dataset, "input_ids")], kind="stable")
        self.by_length = dataset.select(self.order) if hasattr(dataset, "select") else [dataset[i] for i in self.order]
        self._split_order = np.argsort(self.order, kind="stable")  # sorted position -> split position
        self.predictions: np.ndarray | None = None

    def _collate_inputs(self, rows: list[dict]) -> dict:
        # No loss is needed to predict: the model gets the batch without its labels.
        return self.collate_fn([{k: v for k, v in row.items() if k != "labels"} for row in rows])

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        logits = [
            out.logits.float().cpu()
            for _, out in model_outputs(model, self.by_length, self._collate_inputs, self.batch_size, self.bf16)
        ]
        logits = torch.cat(logits).numpy()[self._split_order]  # (N, num_labels), split order
        self.predictions = logits.argmax(-1) if self.label_names else logits[:, 0]
        return self.metric.compute(predictions=self.predictions, references=self.references)

    def write_predictions(self, directory: Path) -> dict[str, str]:
        if self.predictions is None:
            raise ValueError("no predictions yet: call the evaluator on a model first")
        write_label_predictions(
            Path(directory) / LABELS_FILE, self.idx, self.predictions, self.references, self.label_names
        )
        return {"predictions": LABELS_FILE}
