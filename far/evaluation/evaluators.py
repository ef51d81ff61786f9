"""Evaluators: dev-set predictions -> metrics, keeping the predictions to write out.

An evaluator is a callable `eval_fn(model) -> dict[str, float]`, the form `far.finetune` takes; it
runs the model in eval mode under no_grad and puts the model back in the mode it found it in.
`write_predictions(directory)` then writes the last predictions there and returns
`{what: file name}`, so that a run's report can list them without knowing the task.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import datasets
import torch

from far.data.glue import GlueTask
from far.data.squad import EVAL_ONLY_COLUMNS
from far.evaluation.labels import LabelEvaluator, model_outputs
from far.evaluation.scores import GlueScores
from far.evaluation.squad_postprocess import QAPredictions, postprocess_qa_predictions, write_predictions
from far.evaluation.squad_scores import squad_scores, squad_v2_scores

ANSWERS_FILE = "predictions.json"  # SQuAD: the official {id: answer} file
NULL_ODDS_FILE = "null_odds.json"  # SQuAD v2: the official no-answer odds


class Evaluator(Protocol):
    """What a training run evaluates with and reports from; `predictions` is None until it has been called."""

    predictions: object

    def __call__(self, model: torch.nn.Module) -> dict[str, float]: ...

    def write_predictions(self, directory: Path) -> dict[str, str]: ...


class GlueEvaluator(LabelEvaluator):
    """Scores a GLUE dev split (tokenised by `tokenize_glue`) with the task's GLUE metric; `options` are
    `LabelEvaluator`'s (batch_size, bf16, idx).

    Example:
        >>> evaluator = GlueEvaluator(GLUE_TASKS["cola"], dev, DataCollatorWithPadding(tokenizer))
        >>> evaluator(model)
        {'matthews_correlation': 0.41}
    """

    def __init__(self, task: GlueTask, dataset: datasets.Dataset, collate_fn: Callable, **options: Any) -> None:
        super().__init__(dataset, collate_fn, label_names=task.label_names, metric=GlueScores(task.name), **options)
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
        score = squad_v2_scores if self.version_2 else squad_scores
        return score(self.predictions.for_metric(self.version_2), self.references)

    def write_predictions(self, directory: Path) -> dict[str, str]:
        if self.predictions is None:
            raise ValueError("no predictions yet: call the evaluator on a model first")
        files = {"predictions": ANSWERS_FILE}
        odds = None
        if self.version_2:
            odds, files["null_odds"] = Path(directory) / NULL_ODDS_FILE, NULL_ODDS_FILE
        write_predictions(self.predictions, Path(directory) / ANSWERS_FILE, odds)
        return files
