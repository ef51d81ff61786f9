"""The lean causal-LM runtime: GGUF models run and trained in plain torch, without transformers' model code.

GGUF files as cached Hugging Face folders (`far.llm.gguf`), the GGUF reader and the lean model
(`gguf_file`, `lean_model`, `lean_config`), FAR on it (`lean_far`), MeZO for it (`zo`), its prefix
cache and its saving, and what runs it in the training engine (`text_runner`, `prompt_runner`), with AdamW's
state shared out over torchrun's processes under `--distributed fsdp` (`owned_adamw`).
What transformers causal LMs use (gradient priming, resident-memory control) is in `far.training`;
the causal-LM run of a GLUE task is `far.recipes.causal_lm`, of a user's texts `far.recipes.own_texts`.

    >>> from far.llm import ensure_gguf_cache
    >>> folder = ensure_gguf_cache(gguf_path)  # a dequantised Hugging Face folder, built once
"""

from __future__ import annotations

from far.lazy import lazy_face

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
lazy_face(
    __name__,
    {
        "far.llm.gguf": ("default_cache_dir", "ensure_gguf_cache", "gguf_cache_path"),
    },
)
