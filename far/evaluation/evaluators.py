"""Evaluators: dev-set predictions -> metrics, keeping the predictions to write out.

An evaluator is a callable `eval_fn(model) -> dict[str, float]`, the form `far.finetune` takes; it
runs the model in eval mode under no_grad and puts the model back in the mode it found it in.
`write_predictions(directory)` then writes the last predictions there and returns
`{what: file name}`, so that a run's report can list them without knowing the task.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader

from far.atomic import atomic_file
from far.data.glue import GlueTask
from far.data.squad import EVAL_ONLY_COLUMNS
from far.evaluation import metrics
from far.evaluation.squad_postprocess import QAPredictions, postprocess_qa_predictions, write_predictions

LABELS_FILE = "predictions.tsv"  # GLUE-style tasks: one row per example
ANSWERS_FILE = "predictions.json"  # SQuAD: the official {id: answer} file
NULL_ODDS_FILE = "null_odds.json"  # SQuAD v2: the official no-answer odds


class Evaluator(Protocol):
    """What a training run evaluates with and reports from."""

    def __call__(self, model: torch.nn.Module) -> dict[str, float]: ...

    def write_predictions(self, directory: Path) -> dict[str, str]: ...


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
    model: torch.nn.Module, dataset: datasets.Dataset, collate_fn: Callable, batch_size: int, bf16: bool
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
                "pearson": metrics.pearson(predictions, references),
                "spearmanr": metrics.spearman(predictions, references),
            }
        return {
            "accuracy": metrics.accuracy(predictions, references),
            "macro_f1": metrics.f1(predictions, references, average="macro"),
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
        dataset: datasets.Dataset,
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
        self.references = np.asarray(dataset["labels"])
        self.dataset = dataset.remove_columns("labels")  # no loss needed to predict
        self.predictions: np.ndarray | None = None

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        logits = [
            out.logits.float().cpu()
            for _, out in model_outputs(model, self.dataset, self.collate_fn, self.batch_size, self.bf16)
        ]
        logits = torch.cat(logits).numpy()  # (N, num_labels)
        self.predictions = logits.argmax(-1) if self.label_names else logits[:, 0]
        return self.metric.compute(predictions=self.predictions, references=self.references)

    def write_predictions(self, directory: Path) -> dict[str, str]:
        if self.predictions is None:
            raise ValueError("no predictions yet: call the evaluator on a model first")
        write_label_predictions(
            Path(directory) / LABELS_FILE, self.idx, self.predictions, self.references, self.label_names
        )
        return {"predictions": LABELS_FILE}


class GlueEvaluator(LabelEvaluator):
    """Scores a GLUE dev split (tokenised by `tokenize_glue`) with the task's GLUE metric.

    Example:
        >>> evaluator = GlueEvaluator(GLUE_TASKS["cola"], dev, DataCollatorWithPadding(tokenizer))
        >>> evaluator(model)
        {'matthews_correlation': 0.41}
    """

    def __init__(
        self,
        task: GlueTask,
        dataset: datasets.Dataset,
        collate_fn: Callable,
        batch_size: int = 64,
        bf16: bool = False,
        idx: Sequence[int] | None = None,
    ) -> None:
        super().__init__(
            dataset,
            collate_fn,
            label_names=task.label_names,
            metric=metrics.load("glue", task.name),
            batch_size=batch_size,
            bf16=bf16,
            idx=idx,
        )
        self.task = task


class SquadEvaluator:
    """Scores SQuAD questions from their evaluation windows; `predictions` holds the last answers.

    Args:
        examples: the questions (id, context, answers).
        features: their windows, from `squad_eval_dataset`.
        collate_fn: pads model inputs (e.g. `DataCollatorWithPadding(tokenizer)`).
        padding_side: the tokenizer's, to cut each window's logits back to its own tokens.
    """

    def __init__(
        self,
        examples: datasets.Dataset,
        features: datasets.Dataset,
        collate_fn: Callable,
        padding_side: str = "right",
        batch_size: int = 64,
        bf16: bool = False,
        version_2: bool = False,
        n_best: int = 20,
        max_answer_length: int = 30,
    ) -> None:
        self.examples, self.features, self.collate_fn = examples, features, collate_fn
        self.padding_side, self.batch_size, self.bf16, self.version_2 = padding_side, batch_size, bf16, version_2
        self.n_best, self.max_answer_length = n_best, max_answer_length
        self.inputs = features.remove_columns([c for c in EVAL_ONLY_COLUMNS if c in features.column_names])
        self.lengths = [len(ids) for ids in features["input_ids"]]
        self.references = [{"id": e["id"], "answers": e["answers"]} for e in examples]
        self.metric = metrics.load("squad_v2" if version_2 else "squad")
        self.predictions: QAPredictions | None = None

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        starts, ends, row = [], [], 0
        for _, out in model_outputs(model, self.inputs, self.collate_fn, self.batch_size, self.bf16):
            start, end = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()  # (B, L)
            width = start.shape[1]
            for b in range(start.shape[0]):
                n = self.lengths[row]
                window = slice(0, n) if self.padding_side == "right" else slice(width - n, width)
                starts.append(start[b, window])
                ends.append(end[b, window])
                row += 1
        self.predictions = postprocess_qa_predictions(
            self.examples,
            self.features,
            starts,
            ends,
            n_best=self.n_best,
            max_answer_length=self.max_answer_length,
            version_2=self.version_2,
        )
        return self.metric.compute(predictions=self.predictions.for_metric(self.version_2), references=self.references)

    def write_predictions(self, directory: Path) -> dict[str, str]:
        if self.predictions is None:
            raise ValueError("no predictions yet: call the evaluator on a model first")
        files = {"predictions": ANSWERS_FILE}
        odds = None
        if self.version_2:
            odds, files["null_odds"] = Path(directory) / NULL_ODDS_FILE, NULL_ODDS_FILE
        write_predictions(self.predictions, Path(directory) / ANSWERS_FILE, odds)
        return files
