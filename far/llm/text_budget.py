"""The memory plan of a causal LM's fine-tune on text: from the GGUF file's header, before anything loads.

A run on the lean runtime holds, at its peak:

    peak = base + weights + trainable state + activations(micro-batch) + kept bottom states

`base` is the process without the model (torch, tokenizers, the packed texts); `weights` is every
matrix in bf16 plus the Q8_0 embedding (`far.llm.compact`); the trainable state is what the optimizer
adds per trained value (MeZO in bf16: nothing; fp32 storage: 2 bytes more; AdamW: fp32 weight,
gradient and two moments); activations are one micro-batch's: one layer's temporaries and the
vocabulary slices of the loss (`far.llm.next_token`), and for a backward pass each trained layer's
input, kept for its recomputation; the kept bottom states (`far.llm.prefix.PrefixCache`) take what
the budget leaves, up to `PREFIX_CACHE_MIB`. The levers, in order: fewer kept states, then smaller
micro-batches (the same chunks per step, their losses or gradients summed). The minimum is one chunk
per micro-batch and nothing kept; a smaller budget is refused with that number, before loading.

    >>> plan = plan_text_memory(700, "SmolLM2-135M.gguf", optimizer="mezo", trained=TrainedShare(...), ...)
    >>> plan.micro_batch, plan.prefix_cache_mib
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from far.llm.gguf_file import read_config, read_header
from far.llm.lean_config import LeanConfig
from far.llm.next_token import VOCAB_SLICE
from far.training.budget import MemoryBudgetError

MIB = 2**20
# The process before the weights load: torch and tokenizers imported, the tokenizer and the packed texts
# in memory, and what the first forward pass allocates for good (SmolLM2-135M, one thread; see docs/llm.md).
BASE_MIB = 300.0
# The frozen bottom's kept states take at most this much (more keeps more chunks' states; fewer recomputes them).
PREFIX_CACHE_MIB = 64.0
# Extra bytes per trained value beyond its bf16 storage.
STATE_BYTES = {("mezo", "bfloat16"): 0, ("mezo", "float32"): 2, ("adamw", "float32"): 2 + 4 + 8}


@dataclass(frozen=True)
class TrainedShare:
    """What trains: the bottom `frozen_layers` layers not at all; above them everything outside the FFNs
    and `ffn_share` of the FFN nodes of the whole model (FAR's retention; 1.0: every node above)."""

    frozen_layers: int
    ffn_share: float


@dataclass(frozen=True)
class TextMemoryPlan:
    budget_mib: int
    estimate_mib: int
    minimum_mib: int
    micro_batch: int
    prefix_cache_mib: float


def parameter_counts(config: LeanConfig) -> dict[str, int]:
    """Values of the embedding, of one layer's attention (and norms), and of one layer's FFN."""
    h, hd = config.hidden_size, config.head_dim
    attention = 2 * h * config.num_heads * hd + 2 * h * config.num_kv_heads * hd + 4 * h + 2 * hd
    return {"embedding": config.vocab_size * h, "attention": attention, "ffn": 3 * h * config.intermediate_size}


def trained_values(config: LeanConfig, share: TrainedShare) -> int:
    counts, n = parameter_counts(config), config.num_layers
    above = n - share.frozen_layers
    ffn = counts["ffn"] * (min(share.ffn_share * n, above) if share.ffn_share < 1 else above)
    return int(counts["attention"] * above + ffn)


def _activation_mib(config: LeanConfig, micro: int, length: int, trained_layers: int, backward: bool) -> float:
    h, f, tokens = config.hidden_size, config.intermediate_size, micro * length
    layer = tokens * (8 * h + 4 * f) * 4  # one layer's temporaries: norms, q/k/v/o, gate/up/act, residuals
    scores = micro * config.num_heads * length * length * 4 * 2  # attention weights, where a mask makes them explicit
    head = tokens * VOCAB_SLICE * 4 * 2 + VOCAB_SLICE * h * 4 + tokens * h * 4 * 2  # logits, exp, slice, hidden
    total = layer + scores + head
    if backward:  # each trained layer's input kept, and one layer rebuilt with its graph at a time
        total += tokens * h * 4 * trained_layers + layer + scores
    return total / MIB


def plan_text_memory(
    budget_mib: float,
    gguf_path: str | os.PathLike,
    *,
    optimizer: str,
    trainable_dtype: str,
    trained: TrainedShare,
    batch_size: int,
    max_length: int,
) -> TextMemoryPlan:
    """The largest micro-batch (and kept states) that fits `budget_mib`, from the GGUF header alone.

    Raises:
        MemoryBudgetError: even one chunk per micro-batch with nothing kept does not fit; names the minimum.
    """
    header = read_header(gguf_path)
    config = read_config(header)
    counts = parameter_counts(config)
    non_embedding = (counts["attention"] + counts["ffn"]) * config.num_layers
    weights = (non_embedding * 2 + counts["embedding"] * 34 / 32) / MIB
    key = (optimizer, trainable_dtype if optimizer == "mezo" else "float32")
    state = trained_values(config, trained) * STATE_BYTES[key] / MIB
    fixed = BASE_MIB + weights + state
    trained_layers = config.num_layers - trained.frozen_layers

    def estimate(micro: int, cache: float) -> float:
        return fixed + _activation_mib(config, micro, max_length, trained_layers, optimizer == "adamw") + cache

    minimum = math.ceil(estimate(1, 0.0))
    if budget_mib < minimum:
        raise MemoryBudgetError(
            f"a memory budget of {budget_mib:g} MiB cannot fit this run: it needs {minimum} MiB at least (the model's "
            f"weights {weights:.0f} MiB, the {optimizer} state {state:.0f} MiB, one chunk of {max_length} tokens at a "
            f"time). Give --memory-budget {minimum} or more, a smaller --max-length, or --optimizer mezo",
            minimum,
        )
    for micro in range(batch_size, 0, -1):
        left = budget_mib - estimate(micro, 0.0)
        if left >= 0:
            cache = min(PREFIX_CACHE_MIB, left)
            return TextMemoryPlan(int(budget_mib), math.ceil(estimate(micro, cache)), minimum, micro, cache)
    raise AssertionError("unreachable: one chunk fits")
