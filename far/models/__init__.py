"""Models by name: the alias table (`far.models.aliases`) and loading with a task's head (`far.models.loading`).

>>> from far.models import load_model_and_tokenizer, load_causal_lm
>>> model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
>>> lm, tokenizer = load_causal_lm("smollm2-135m")
"""

from __future__ import annotations

from far.models.aliases import (
    DEFAULT_MODEL,
    MODEL_ALIASES,
    RUNTIMES,
    FindSpec,
    ModelAlias,
    find_gguf,
    is_causal_lm,
    resolve_model,
)
from far.models.loading import (
    check_max_length,
    lean_runtime_fits,
    load_causal_lm,
    load_lean_lm,
    load_model_and_tokenizer,
    load_trained_model,
)

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_ALIASES",
    "RUNTIMES",
    "FindSpec",
    "ModelAlias",
    "check_max_length",
    "find_gguf",
    "is_causal_lm",
    "lean_runtime_fits",
    "load_causal_lm",
    "load_lean_lm",
    "load_model_and_tokenizer",
    "load_trained_model",
    "resolve_model",
]
