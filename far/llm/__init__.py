"""FAR and MeZO for causal LMs within about the memory of inference.

GGUF files as cached Hugging Face folders (`far.llm.gguf`), resident-memory control
(`far.llm.memory`) and priming from gradient magnitudes instead of a weight snapshot
(`far.llm.priming`). The one causal-LM run of a GLUE task is `far.recipes.causal_lm`;
prompts are in `far.data.prompts`, model aliases in `far.models`.

    >>> from far.llm import prime_and_reconfigure
    >>> prime_and_reconfigure(model, batches, loss_fn, far.FARConfig(0.4, freeze_embeddings=True))
"""

from __future__ import annotations

from far.lazy import lazy_names

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
_LAZY = {
    "default_cache_dir": "far.llm.gguf",
    "ensure_gguf_cache": "far.llm.gguf",
    "gguf_cache_path": "far.llm.gguf",
    "page_out_after_forward": "far.llm.memory",
    "release_freed_memory": "far.llm.memory",
    "to_private_memory": "far.llm.memory",
    "ffn_parameter_names": "far.llm.priming",
    "gradient_scores": "far.llm.priming",
    "prime_and_reconfigure": "far.llm.priming",
}

__all__ = [
    "default_cache_dir",
    "ensure_gguf_cache",
    "ffn_parameter_names",
    "gguf_cache_path",
    "gradient_scores",
    "page_out_after_forward",
    "prime_and_reconfigure",
    "release_freed_memory",
    "to_private_memory",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
