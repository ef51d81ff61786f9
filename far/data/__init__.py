"""Data: GLUE and SQuAD (local files first, the hub when online), the user's own files, prompts for causal LMs.

Local data: `data_dir` or $FAR_DATA_DIR with glue/<Task>/{train,dev}.tsv and squad/*.json.

>>> from far.data import load_glue, tokenize_glue
>>> splits = load_glue("stsb", "../shared/data")
>>> train = tokenize_glue(splits["train"], tokenizer, "stsb", max_length=128)
"""

from __future__ import annotations

from far.lazy import lazy_names

# Names are imported on first use (PEP 562): the lean causal-LM path reads prompts and the data folder
# from here and must not pay for `datasets`, which the GLUE, SQuAD and file readers import.
_LAZY = {
    "DataFileError": "far.data.files",
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
    "resolve_data_dir": "far.data.locate",
    "SST2_TEMPLATE": "far.data.prompts",
    "PromptTemplate": "far.data.prompts",
    "DEFAULT_HOLDOUT_ARTICLES": "far.data.squad",
    "load_squad": "far.data.squad",
    "read_squad_json": "far.data.squad",
    "split_by_article": "far.data.squad",
    "squad_eval_dataset": "far.data.squad",
    "squad_train_dataset": "far.data.squad",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
