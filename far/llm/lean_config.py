"""`LeanConfig`: what the lean causal-LM runtime needs to know about a llama (SmolLM2) or gemma3 model,
read from GGUF metadata (`far.llm.gguf_file`) or a transformers config (`from_hf_config`, parity tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ARCHITECTURES = ("llama", "gemma3")
FULL, SLIDING = "full_attention", "sliding_attention"
# A transformers config's field -> the `LeanConfig` field of the same meaning, read one way by `from_hf_config` and
# the other by `far.methods.lean_hf.hf_config`.
HF_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "rms_norm_eps": "rms_eps",
}


@dataclass(frozen=True)
class LeanConfig:
    """Shapes and constants of a Llama or Gemma-3 decoder (transformers' names, shortened).

    Args:
        rope_theta: Rotary base of full-attention layers; `rope_local_theta` of sliding ones (Gemma-3).
        layer_types: Per layer, "full_attention" or "sliding_attention".
        sliding_window: Keys a sliding layer's query sees (itself included).
        query_scale: Attention logits' scale (Gemma-3: query_pre_attn_scalar ** -0.5).
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_local_theta: float = 10000.0
    layer_types: tuple[str, ...] = field(default=())
    sliding_window: int | None = None
    query_scale: float | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"the lean runtime knows {', '.join(ARCHITECTURES)}, not {self.arch!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.num_layers} layers")
        if self.query_scale is None:
            object.__setattr__(self, "query_scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def is_gemma(self) -> bool:
        return self.arch == "gemma3"


def gemma3_layer_types(num_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Gemma-3's layout: every `pattern`-th layer attends globally, the others in a sliding window."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers))


def from_hf_config(config) -> LeanConfig:
    """The `LeanConfig` of a transformers `LlamaConfig` or `Gemma3TextConfig` (used by the parity tests)."""
    arch = {"llama": "llama", "gemma3_text": "gemma3"}.get(config.model_type)
    if arch is None:
        raise ValueError(f"no lean runtime for model_type {config.model_type!r}; use llama or gemma3_text")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    if arch == "gemma3":
        full = rope.get(FULL, {}).get("rope_theta", getattr(config, "rope_theta", 1e6))
        local = rope.get(SLIDING, {}).get("rope_theta", getattr(config, "rope_local_base_freq", 1e4))
        types = tuple(config.layer_types)
        scale = config.query_pre_attn_scalar**-0.5
        window = config.sliding_window
    else:
        full = rope.get("rope_theta", getattr(config, "rope_theta", 1e4))
        local, types, scale, window = full, (), None, None
    return LeanConfig(
        arch=arch,
        **{lean: getattr(config, hf) for hf, lean in HF_FIELDS.items()},
        head_dim=head_dim,
        rope_theta=float(full),
        rope_local_theta=float(local),
        layer_types=types,
        sliding_window=window,
        query_scale=scale,
    )
