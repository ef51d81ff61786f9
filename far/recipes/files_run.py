"""The run on the user's own files (`far train`): classification or regression, scored on the validation file.

Imports neither `datasets` nor `evaluate`: the files are read as tables (`far.data.table`), tokenised
into packed examples (`far.data.encoded`) and scored with `far.evaluation.labels`, so that a run under
a memory budget pays only for torch, the tokenizer and the model.

    >>> files = load_text_files("examples/reviews/train.csv", "examples/reviews/dev.csv")
    >>> record = train_and_report(text_files_run(RunSettings(method="far"), files))
"""

from __future__ import annotations

from transformers import DataCollatorWithPadding

from far.data.encoded import encode_texts
from far.data.files import TextFiles
from far.evaluation.labels import LabelEvaluator, TextMetric
from far.recipes.report import TrainingRun
from far.recipes.settings import FILE_DEFAULTS, RunSettings, train_and_eval_splits
from far.recipes.task_model import COLUMNS_KEY, task_model, task_run


def text_files_run(settings: RunSettings, files: TextFiles, *, check_output: bool = True) -> TrainingRun:
    """A run on the user's own files (`load_text_files`): classification or regression, scored on the validation file.

    The saved model's config holds the class names (`id2label` / `label2id`) and the text and label
    columns (`far_columns`), which `far.recipes.predict` reads back.

    Example:
        >>> files = load_text_files("examples/reviews/train.csv", "examples/reviews/dev.csv")
        >>> record = train_and_report(text_files_run(RunSettings(method="far"), files))
    """
    hparams = settings.hyperparameters(FILE_DEFAULTS)
    if check_output:  # False: a run that writes no output folder (`far prime`)
        settings.check_output(files.name)
    labels = files.labels
    train_raw, dev_raw = train_and_eval_splits(settings, files.train, files.validation)
    columns = {COLUMNS_KEY: {"text": list(files.text_columns), "label": files.label_column}}
    loaded = model, tokenizer, _ = task_model(
        settings,
        hparams["max_length"],
        labels.kind,
        labels.num_labels,
        label_names=labels.names or None,
        config=columns,
    )

    def encode(rows: object) -> object:
        return encode_texts(rows, tokenizer, files.text_columns, hparams["max_length"])

    evaluator = LabelEvaluator(
        encode(dev_raw),
        DataCollatorWithPadding(tokenizer),
        label_names=labels.names,
        metric=TextMetric(labels.kind),
        batch_size=settings.eval_batch_size,
        bf16=settings.options.precision_for(model).bf16,  # the training's precision
    )
    return task_run(
        settings,
        files.name,
        loaded,
        encode(train_raw),
        evaluator,
        hparams,
        train_examples=len(train_raw),
        eval_examples=len(dev_raw),
        text_columns=list(files.text_columns),
        label_column=files.label_column,
        labels=list(labels.names) if labels.names else "regression",
    )
