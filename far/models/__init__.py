"""Models by name: the alias table (`far.models.aliases`) and loading with a task's head (`far.models.loading`).

>>> from far.models import load_model_and_tokenizer, load_causal_lm
>>> model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
>>> lm, tokenizer = load_causal_lm("smollm2-135m")
"""

from __future__ import annotations

from far.lazy import lazy_face

lazy_face(
    __name__,
    {
        "far.models.aliases": (
            "DEFAULT_MODEL",
            "MODEL_ALIASES",
            "RUNTIMES",
            "FindSpec",
            "ModelAlias",
            "find_gguf",
            "is_causal_lm",
            "resolve_model",
        ),
        "far.models.loading": (
            "check_max_length",
            "lean_runtime_fits",
            "load_causal_lm",
            "load_lean_lm",
            "load_model_and_tokenizer",
            "load_trained_model",
        ),
    },
)
