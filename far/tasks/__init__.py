"""Tasks: the data, models and evaluation that a notebook, a script or the `far` command needs.

GLUE and SQuAD data (local files first: `data_dir` / $FAR_DATA_DIR, the hub when online), models
by alias with the head a task needs, prompt-based classification for causal LMs, evaluators that
keep and write their predictions, the one train-and-report path of every training command, the
user's own CSV/TSV/JSON/JSONL files (`load_text_files`, `text_files_run`) and predictions (`predict`).

>>> from far.tasks import GLUE_TASKS, load_glue, load_model_and_tokenizer, tokenize_glue
>>> splits = load_glue("stsb", "../shared/data")
>>> train = tokenize_glue(splits["train"], tokenizer, "stsb", max_length=128)
>>> record = train_and_report(glue_run(RunSettings(method="far", max_steps=100), "stsb"))
>>> record = train_and_report(glue_run(RunSettings(method="lora", lora_r=8, lr=1e-3), "stsb"))  # PEFT's LoRA
>>> predict("runs/stsb-far/model", [("A man plays a guitar.", "Someone plays music.")])
"""

from __future__ import annotations

from far.lazy import lazy_names

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
_LAZY = {
    "LoraSettings": "far.tasks.lora",
    "add_lora": "far.tasks.lora",
    "load_lora_adapter": "far.tasks.lora",
    "save_lora": "far.tasks.lora",
    "Evaluator": "far.tasks.evaluators",
    "GlueEvaluator": "far.tasks.evaluators",
    "LabelEvaluator": "far.tasks.evaluators",
    "PromptEvaluator": "far.tasks.evaluators",
    "SquadEvaluator": "far.tasks.evaluators",
    "TextMetric": "far.tasks.evaluators",
    "write_label_predictions": "far.tasks.evaluators",
    "DataFileError": "far.tasks.files",
    "LabelSpace": "far.tasks.files",
    "TextFiles": "far.tasks.files",
    "load_text_files": "far.tasks.files",
    "read_table": "far.tasks.files",
    "tokenize_texts": "far.tasks.files",
    "GLUE_TASKS": "far.tasks.glue",
    "GlueTask": "far.tasks.glue",
    "get_task": "far.tasks.glue",
    "load_glue": "far.tasks.glue",
    "read_glue_tsv": "far.tasks.glue",
    "tokenize_glue": "far.tasks.glue",
    "DATA_DIR_ENV": "far.tasks.locate",
    "hub_offline": "far.tasks.locate",
    "resolve_data_dir": "far.tasks.locate",
    "DEFAULT_MODEL": "far.tasks.models",
    "MODEL_ALIASES": "far.tasks.models",
    "ModelAlias": "far.tasks.models",
    "check_max_length": "far.tasks.models",
    "find_gguf": "far.tasks.models",
    "is_causal_lm": "far.tasks.models",
    "load_causal_lm": "far.tasks.models",
    "load_model_and_tokenizer": "far.tasks.models",
    "resolve_model": "far.tasks.models",
    "Predictor": "far.tasks.predict",
    "predict": "far.tasks.predict",
    "prompted_run": "far.tasks.prompted",
    "TrainingRun": "far.tasks.report",
    "train_and_report": "far.tasks.report",
    "SquadSettings": "far.tasks.runs",
    "glue_evaluator": "far.tasks.runs",
    "glue_run": "far.tasks.runs",
    "squad_evaluator": "far.tasks.runs",
    "squad_run": "far.tasks.runs",
    "text_files_run": "far.tasks.runs",
    "METHODS": "far.tasks.settings",
    "Method": "far.tasks.settings",
    "RunSettings": "far.tasks.settings",
    "DEFAULT_HOLDOUT_ARTICLES": "far.tasks.squad",
    "load_squad": "far.tasks.squad",
    "read_squad_json": "far.tasks.squad",
    "split_by_article": "far.tasks.squad",
    "squad_eval_dataset": "far.tasks.squad",
    "squad_train_dataset": "far.tasks.squad",
    "QAPredictions": "far.tasks.squad_postprocess",
    "postprocess_qa_predictions": "far.tasks.squad_postprocess",
    "write_predictions": "far.tasks.squad_postprocess",
}

__all__ = [
    "LoraSettings",
    "add_lora",
    "load_lora_adapter",
    "save_lora",
    "DATA_DIR_ENV",
    "DataFileError",
    "LabelEvaluator",
    "LabelSpace",
    "Predictor",
    "TextFiles",
    "TextMetric",
    "load_text_files",
    "predict",
    "read_table",
    "text_files_run",
    "tokenize_texts",
    "DEFAULT_HOLDOUT_ARTICLES",
    "DEFAULT_MODEL",
    "GLUE_TASKS",
    "METHODS",
    "MODEL_ALIASES",
    "Evaluator",
    "GlueEvaluator",
    "GlueTask",
    "Method",
    "ModelAlias",
    "PromptEvaluator",
    "QAPredictions",
    "RunSettings",
    "SquadEvaluator",
    "SquadSettings",
    "TrainingRun",
    "check_max_length",
    "find_gguf",
    "get_task",
    "glue_evaluator",
    "glue_run",
    "hub_offline",
    "is_causal_lm",
    "load_causal_lm",
    "load_glue",
    "load_model_and_tokenizer",
    "load_squad",
    "postprocess_qa_predictions",
    "prompted_run",
    "read_glue_tsv",
    "read_squad_json",
    "resolve_data_dir",
    "resolve_model",
    "split_by_article",
    "squad_eval_dataset",
    "squad_evaluator",
    "squad_run",
    "squad_train_dataset",
    "tokenize_glue",
    "train_and_report",
    "write_label_predictions",
    "write_predictions",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
