"""Deprecated: the names `far.tasks` once held, now in rooms by concern.

`far.data` (GLUE, SQuAD, the user's files, prompts), `far.evaluation` (evaluators and metrics),
`far.models` (model aliases and loading), `far.methods` (full, FAR, LoRA, ...) and `far.recipes`
(run settings, runs, reports, predictions). An old name still works, with a DeprecationWarning
that names its new home.
"""

from __future__ import annotations

import importlib
import warnings

_MOVED = {
    "LoraSettings": "far.methods.lora",
    "add_lora": "far.methods.lora",
    "load_lora_adapter": "far.methods.lora",
    "save_lora": "far.methods.lora",
    "Evaluator": "far.evaluation.evaluators",
    "GlueEvaluator": "far.evaluation.evaluators",
    "LabelEvaluator": "far.evaluation.labels",
    "SquadEvaluator": "far.evaluation.evaluators",
    "TextMetric": "far.evaluation.labels",
    "write_label_predictions": "far.evaluation.labels",
    "DataFileError": "far.data.files",
    "LabelSpace": "far.data.files",
    "TextFiles": "far.data.files",
    "load_text_files": "far.data.files",
    "read_table": "far.data.files",
    "tokenize_texts": "far.data.files",
    "GLUE_TASKS": "far.data.glue",
    "GlueTask": "far.data.glue",
    "get_task": "far.data.glue",
    "load_glue": "far.data.glue",
    "read_glue_tsv": "far.data.glue",
    "tokenize_glue": "far.data.glue",
    "DATA_DIR_ENV": "far.data.locate",
    "hub_offline": "far.data.locate",
    "resolve_data_dir": "far.data.locate",
    "DEFAULT_MODEL": "far.models",
    "MODEL_ALIASES": "far.models",
    "ModelAlias": "far.models",
    "check_max_length": "far.models",
    "find_gguf": "far.models",
    "is_causal_lm": "far.models",
    "load_causal_lm": "far.models",
    "load_model_and_tokenizer": "far.models",
    "resolve_model": "far.models",
    "Predictor": "far.recipes.predict",
    "predict": "far.recipes.predict",
    "TrainingRun": "far.recipes.report",
    "train_and_report": "far.recipes.report",
    "SquadSettings": "far.recipes.runs",
    "glue_evaluator": "far.recipes.runs",
    "glue_run": "far.recipes.runs",
    "squad_evaluator": "far.recipes.runs",
    "squad_run": "far.recipes.runs",
    "text_files_run": "far.recipes.files_run",
    "METHODS": "far.methods",
    "Method": "far.methods",
    "RunSettings": "far.recipes.settings",
    "DEFAULT_HOLDOUT_ARTICLES": "far.data.squad",
    "load_squad": "far.data.squad",
    "read_squad_json": "far.data.squad",
    "split_by_article": "far.data.squad",
    "squad_eval_dataset": "far.data.squad",
    "squad_train_dataset": "far.data.squad",
    "QAPredictions": "far.evaluation.squad_postprocess",
    "postprocess_qa_predictions": "far.evaluation.squad_postprocess",
    "write_predictions": "far.evaluation.squad_postprocess",
}

__all__ = sorted(_MOVED)


def __getattr__(name: str) -> object:
    source = _MOVED.get(name)
    if source is None:
        raise AttributeError(f"module 'far.tasks' has no attribute {name!r}")
    warnings.warn(f"far.tasks.{name} moved: import it from {source}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(source), name)


def __dir__() -> list[str]:
    return __all__
