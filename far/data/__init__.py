"""Data: GLUE and SQuAD (local files first, the hub when online), the user's own files, prompts for causal LMs.

Local data: `data_dir` or $FAR_DATA_DIR with glue/<Task>/{train,dev}.tsv and squad/*.json.

>>> from far.data import load_glue, tokenize_glue
>>> splits = load_glue("stsb", "../shared/data")
>>> train = tokenize_glue(splits["train"], tokenizer, "stsb", max_length=128)
"""

from __future__ import annotations

from far.lazy import lazy_face

# Names are imported on first use (PEP 562): the lean causal-LM path reads prompts and the data folder
# from here and must not pay for `datasets`, which the GLUE, SQuAD and file readers import.
lazy_face(
    __name__,
    {
        "far.data.files": ("DataFileError", "TextFiles", "load_text_files", "read_table", "tokenize_texts"),
        "far.data.glue": ("GLUE_TASKS", "GlueTask", "get_task", "load_glue", "read_glue_tsv", "tokenize_glue"),
        "far.data.locate": ("DATA_DIR_ENV", "resolve_data_dir"),
        "far.data.prompts": ("SST2_TEMPLATE", "PromptTemplate"),
        "far.data.squad": (
            "DEFAULT_HOLDOUT_ARTICLES",
            "load_squad",
            "read_squad_json",
            "split_by_article",
            "squad_eval_dataset",
            "squad_train_dataset",
        ),
    },
)
