"""FAR and MeZO for causal LMs within about the memory of inference.

GGUF files as cached Hugging Face folders (`far.llm.gguf`), resident-memory control
(`far.llm.memory`) and priming from gradient magnitudes instead of a weight snapshot
(`far.llm.priming`). Nothing here knows a task: prompts and model aliases are in `far.tasks`.

    >>> from far.llm import prime_and_reconfigure
    >>> prime_and_reconfigure(model, batches, loss_fn, far.FARConfig(0.4, freeze_embeddings=True))
"""

from far.llm.gguf import default_cache_dir, ensure_gguf_cache, gguf_cache_path
from far.llm.memory import page_out_after_forward, release_freed_memory, to_private_memory
from far.llm.priming import ffn_parameter_names, gradient_scores, prime_and_reconfigure

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
