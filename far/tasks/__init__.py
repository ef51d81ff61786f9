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

from far.tasks.evaluators import (
    Evaluator,
    GlueEvaluator,
    LabelEvaluator,
    PromptEvaluator,
    SquadEvaluator,
    TextMetric,
    write_label_predictions,
)
from far.tasks.files import DataFileError, LabelSpace, TextFiles, load_text_files, read_table, tokenize_texts
from far.tasks.glue import GLUE_TASKS, GlueTask, get_task, load_glue, read_glue_tsv, tokenize_glue
from far.tasks.locate import DATA_DIR_ENV, hub_offline, resolve_data_dir
from far.tasks.lora import LoraSettings, add_lora, load_lora_adapter, save_lora
from far.tasks.models import (
    DEFAULT_MODEL,
    MODEL_ALIASES,
    ModelAlias,
    check_max_length,
    find_gguf,
    is_causal_lm,
    load_causal_lm,
    load_model_and_tokenizer,
    resolve_model,
)
from far.tasks.predict import Predictor, predict
from far.tasks.prompted import prompted_run
from far.tasks.report import TrainingRun, train_and_report
from far.tasks.runs import SquadSettings, glue_evaluator, glue_run, squad_evaluator, squad_run, text_files_run
from far.tasks.settings import METHODS, Method, RunSettings
from far.tasks.squad import (
    DEFAULT_HOLDOUT_ARTICLES,
    load_squad,
    read_squad_json,
    split_by_article,
    squad_eval_dataset,
    squad_train_dataset,
)
from far.tasks.squad_postprocess import QAPredictions, postprocess_qa_predictions, write_predictions

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
