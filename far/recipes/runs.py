"""Training runs: GLUE, SQuAD or the user's own files; data, a model with the task's head, an evaluator.

`glue_run`, `squad_run` and `text_files_run` load and tokenise everything a `TrainingRun` needs; `train_and_report`
then trains it. `glue_evaluator` and `squad_evaluator` also score a saved model (`far eval`).
Everything the user can get wrong (data, model, lengths) fails here, before any training.

    >>> record = train_and_report(glue_run(RunSettings(max_steps=100), "cola"))
"""

from __future__ import annotations

from dataclasses import dataclass

import datasets
from transformers import DataCollatorWithPadding

from far.data.glue import GLUE_TASKS, GlueTask, load_glue, tokenize_glue
from far.data.squad import DEFAULT_HOLDOUT_ARTICLES, load_squad, squad_eval_dataset, squad_train_dataset
from far.evaluation.evaluators import GlueEvaluator, SquadEvaluator
from far.recipes.report import TrainingRun
from far.recipes.settings import GLUE_DEFAULTS, SQUAD_DEFAULTS, RunSettings, first, train_and_eval_splits
from far.recipes.task_model import task_model, task_run


@dataclass(frozen=True)
class SquadSettings:
    """Which SQuAD data a run uses, and how answers are read from the logits.

    Args:
        version: "1.1" or "2.0".
        eval_file / train_file: SQuAD JSON files; default the dev file under the data folder,
            split by article (the last `holdout_articles` evaluated on, the others trained on).
        doc_stride: Overlap of a long context's windows (tokens).
        n_best / max_answer_length: Start/end candidates per window; longest answer (tokens).
    """

    version: str = "1.1"
    eval_file: str | None = None
    train_file: str | None = None
    holdout_articles: int | None = None
    doc_stride: int = 128
    n_best: int = 20
    max_answer_length: int = 30

    def __post_init__(self) -> None:
        if self.n_best < 1 or self.max_answer_length < 1:
            raise ValueError(
                f"n_best and max_answer_length must be positive, got {self.n_best} and {self.max_answer_length}"
            )

    @property
    def task(self) -> str:
        return "squad" if self.version == "1.1" else "squad_v2"

    def splits(self, data_dir: str | None) -> datasets.DatasetDict:
        return load_squad(
            self.version,
            data_dir,
            train_file=self.train_file,
            eval_file=self.eval_file,
            holdout_articles=self.holdout_articles,
        )


def glue_evaluator(
    task: GlueTask, raw: datasets.Dataset, tokenizer, max_length: int, *, batch_size: int = 64, bf16: bool = False
) -> GlueEvaluator:
    """An evaluator of the GLUE split `raw` (as `load_glue` returns it)."""
    dev = tokenize_glue(raw, tokenizer, task, max_length)
    collate = DataCollatorWithPadding(tokenizer)
    return GlueEvaluator(task, dev, collate, batch_size=batch_size, bf16=bf16, idx=raw["idx"])


def squad_evaluator(
    squad: SquadSettings,
    examples: datasets.Dataset,
    tokenizer,
    max_length: int,
    *,
    batch_size: int = 64,
    bf16: bool = False,
) -> SquadEvaluator:
    """An evaluator of the SQuAD questions `examples`, over windows of `max_length` tokens."""
    features = squad_eval_dataset(examples, tokenizer, max_length, squad.doc_stride)
    return SquadEvaluator(
        examples,
        features,
        DataCollatorWithPadding(tokenizer),
        tokenizer.padding_side,
        batch_size=batch_size,
        bf16=bf16,
        version_2=squad.version == "2.0",
        n_best=squad.n_best,
        max_answer_length=squad.max_answer_length,
    )


def glue_run(settings: RunSettings, task_name: str, *, check_output: bool = True) -> TrainingRun:
    """A GLUE task's run with an encoder model: fine-tune on its train split, score its dev split (`check_output`
    False: a run that writes no output folder, as `far prime`'s)."""
    task = GLUE_TASKS[task_name]
    hparams = settings.hyperparameters(GLUE_DEFAULTS)
    if check_output:
        settings.check_output(task.name)
    splits = load_glue(task.name, settings.data_dir)
    train_raw, dev_raw = train_and_eval_splits(settings, splits["train"], splits["validation"])
    loaded = model, tokenizer, _ = task_model(
        settings,
        hparams["max_length"],
        task.kind,
        task.num_labels,
        label_names=task.label_names or None,
        finetuning_task=task.name,
    )
    # Scored in the precision the model trains in (the options' one rule), as far.finetune computes it.
    bf16 = settings.options.precision_for(model).bf16
    evaluator = glue_evaluator(
        task, dev_raw, tokenizer, hparams["max_length"], batch_size=settings.eval_batch_size, bf16=bf16
    )
    train = tokenize_glue(train_raw, tokenizer, task, hparams["max_length"])
    return task_run(
        settings,
        task.name,
        loaded,
        train,
        evaluator,
        hparams,
        train_examples=len(train_raw),
        eval_examples=len(dev_raw),
    )


def squad_run(settings: RunSettings, squad: SquadSettings) -> TrainingRun:
    """A SQuAD run: fine-tune for extractive QA, score exact match / F1 on the held-out questions."""
    hparams = settings.hyperparameters(SQUAD_DEFAULTS)
    settings.check_output(squad.task)
    if settings.validation_from_train is not None:
        raise ValueError(
            "SQuAD holds out whole articles, not a fraction of the questions (which would share contexts with "
            "training); use --holdout-articles instead of --validation-from-train"
        )
    splits = squad.splits(settings.data_dir)
    train_raw = first(splits["train"], settings.max_train_samples)
    eval_raw = first(splits["validation"], settings.max_eval_samples)
    loaded = model, tokenizer, _ = task_model(
        settings, hparams["max_length"], "question-answering", finetuning_task=squad.task
    )
    train = squad_train_dataset(train_raw, tokenizer, hparams["max_length"], squad.doc_stride)
    bf16 = settings.options.precision_for(model).bf16  # the training's precision
    evaluator = squad_evaluator(
        squad, eval_raw, tokenizer, hparams["max_length"], batch_size=settings.eval_batch_size, bf16=bf16
    )
    held_out = squad.holdout_articles or DEFAULT_HOLDOUT_ARTICLES
    return task_run(
        settings,
        squad.task,
        loaded,
        train,
        evaluator,
        hparams,
        train_examples=len(train_raw),
        train_features=len(train),
        eval_examples=len(eval_raw),
        eval_features=len(evaluator.features),
        split="train file" if squad.train_file else f"last {held_out} articles held out",
        doc_stride=squad.doc_stride,
        n_best=squad.n_best,
        max_answer_length=squad.max_answer_length,
    )
