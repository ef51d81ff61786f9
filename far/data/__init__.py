"""GLUE and SQuAD data for FAR's scripts: local files first (--data-dir / $FAR_DATA_DIR), the hub when online.

>>> from far.data import load_glue, tokenize_glue
>>> splits = load_glue("stsb", "../shared/data")
>>> train = tokenize_glue(splits["train"], tokenizer, "stsb", max_length=128)
"""

from __future__ import annotations

from far.data.glue import GLUE_TASKS, GlueTask, get_task, load_glue, read_glue_tsv, tokenize_glue
from far.data.locate import DATA_DIR_ENV, hub_offline, resolve_data_dir
from far.data.squad import (
    DEFAULT_HOLDOUT_ARTICLES,
    EVAL_ONLY_COLUMNS,
    load_squad,
    prepare_eval_features,
    prepare_train_features,
    read_squad_json,
    split_by_article,
    squad_eval_dataset,
    squad_train_dataset,
)
from far.data.squad_postprocess import QAPredictions, postprocess_qa_predictions, write_predictions

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_HOLDOUT_ARTICLES",
    "EVAL_ONLY_COLUMNS",
    "GLUE_TASKS",
    "GlueTask",
    "QAPredictions",
    "get_task",
    "hub_offline",
    "load_glue",
    "load_squad",
    "postprocess_qa_predictions",
    "prepare_eval_features",
    "prepare_train_features",
    "read_glue_tsv",
    "read_squad_json",
    "resolve_data_dir",
    "split_by_article",
    "squad_eval_dataset",
    "squad_train_dataset",
    "tokenize_glue",
    "write_predictions",
]
