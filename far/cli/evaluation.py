"""Evaluation loops for the scripts: dev-set predictions -> metrics, keeping the predictions to write out.

An evaluator is a callable `eval_fn(model) -> dict[str, float]`, the form `far.finetune` takes; it
runs the model in eval mode under no_grad and puts the model back in the mode it found it in.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader

from far import metrics
from far.atomic import atomic_file
from far.data.glue import GlueTask
from far.data.squad import EVAL_ONLY_COLUMNS
from far.data.squad_postprocess import QAPredictions, postprocess_qa_predictions


def _batches(
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


class GlueEvaluator:
    """Scores a GLUE dev split (tokenised by `tokenize_glue`); `predictions` holds the last run's outputs.

    Example:
        >>> evaluator = GlueEvaluator(GLUE_TASKS["cola"], dev, DataCollatorWithPadding(tokenizer))
        >>> evaluator(model)
        {'matthews_correlation': 0.41}
    """

    def __init__(
        self, task: GlueTask, dataset: datasets.Dataset, collate_fn: Callable, batch_size: int = 64, bf16: bool = False
    ) -> None:
        self.task, self.collate_fn, self.batch_size, self.bf16 = task, collate_fn, batch_size, bf16
        self.references = np.asarray(dataset["labels"])
        self.dataset = dataset.remove_columns("labels")  # no loss needed to predict
        self.metric = metrics.load("glue", task.name)
        self.predictions: np.ndarray | None = None

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        logits = [
            out.logits.float().cpu()
            for _, out in _batches(model, self.dataset, self.collate_fn, self.batch_size, self.bf16)
        ]
        logits = torch.cat(logits).numpy()  # (N, num_labels)
        self.predictions = logits[:, 0] if self.task.kind == "regression" else logits.argmax(-1)
        return self.metric.compute(predictions=self.predictions, references=self.references)

    def write_predictions(self, path: str | os.PathLike, idx: list[int]) -> None:
        """TSV `index  prediction  label` (class names, or scores for stsb), as run_glue.py's predict file."""
        if self.predictions is None:
            raise ValueError("no predictions yet: call the evaluator on a model first")
        names = self.task.label_names

        def shown(value) -> str:
            return f"{value:.4f}" if not names else names[int(value)]

        with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(["index", "prediction", "label"])
            for i, prediction, label in zip(idx, self.predictions, self.references, strict=True):
                writer.writerow([i, shown(prediction), shown(label)])


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
        for _, out in _batches(model, self.inputs, self.collate_fn, self.batch_size, self.bf16):
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
