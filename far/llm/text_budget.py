"""The memory plan of a causal LM's fine-tune on text: from the GGUF file's header, before anything loads.

A run on the lean runtime peaks in one of two phases:

    loading  = base + weights + one chunk's forward (the bottom's output computed for every chunk)
    training = base + weights - frozen bottom + trainable state + activations(micro-batch)

`base` is the process without the model (torch, the tokenizer, the packed texts); `weights` every
matrix in bf16 plus the Q8_0 embedding. A frozen bottom's output goes to a scratch file and its weights
are freed (`far.llm.bottom_on_disk`); where the disk has no room, the states stay in memory with every
weight loaded (`prefix_cache_mib`, at most `PREFIX_CACHE_MIB`). The trainable state is `STATE_BYTES`
per trained value; activations are one micro-batch's (one layer's temporaries, the loss's vocabulary
slices, and in backward each trained layer's input). The lever is the micro-batch; a budget below one
chunk per micro-batch is refused with the minimum, before loading.

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
from far.llm.text_steps import PRIMING_MICRO_BATCH
from far.training.budget import MemoryBudgetError

MIB = 2**20
# The process before the weights load: torch and tokenizers imported, the packed texts and what the first
# forward pass allocates for good, plus the tokenizer, which grows with the vocabulary (SmolLM2-135M, 49k
# words: 300 MiB; Gemma-3-270M, 262k words: 560; one thread; docs/llm.md).
BASE_MIB, TOKENIZER_BYTES_PER_WORD = 250.0, 1200
# Measured peaks over the activations counted here: 1.07 for an AdamW step of SmolLM2-135M in micro-batches of 4.
ACTIVATION_SLACK = 1.1
# Kept in memory (no room on disk), the frozen bottom's states take at most this much.
PREFIX_CACHE_MIB = 64.0
# Extra bytes per trained value beyond its bf16 storage.
STATE_BYTES = {
    ("mezo", "bfloat16"): 0,
    ("mezo", "float32"): 2,
    ("zo-batched", "bfloat16"): 0,
    ("zo-batched", "float32"): 2,
    ("adamw", "float32"): 2 + 4 + 4,
}


@dataclass(frozen=True)
class TrainedShare:
    """What trains: nothing in the bottom `frozen_layers`; above, everything outside the FFNs and `ffn_share`
    of the whole model's FFN nodes (1.0: every node above).
    """

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
    # The loss's vocabulary slices and the layers never hold their temporaries at once: a forward pass
    # holds the larger; backward holds each trained layer's input, kept for recomputation, and one layer
    # rebuilt with its graph. ACTIVATION_SLACK covers the allocator's rounding (measured: docs/llm.md).
    if not backward:
        return ACTIVATION_SLACK * max(layer + scores, head) / MIB
    return ACTIVATION_SLACK * max(tokens * h * 4 * trained_layers + layer + scores, head) / MIB


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
    """The largest micro-batch (and kept states) that fits `budget_mib`, from the GGUF header alone
    (`MemoryBudgetError` with the minimum otherwise).
    """
    header = read_header(gguf_path)
    config = read_config(header)
    counts = parameter_counts(config)
    layer = (counts["attention"] + counts["ffn"]) * 2 / MIB
    weights = layer * config.num_layers + counts["embedding"] * 34 / 32 / MIB
    base = BASE_MIB + config.vocab_size * TOKENIZER_BYTES_PER_WORD / MIB
    key = (optimizer, trainable_dtype if optimizer != "adamw" else "float32")
    state = trained_values(config, trained) * STATE_BYTES[key] / MIB
    trained_layers = config.num_layers - trained.frozen_layers
    backward = optimizer == "adamw"
    # Gradient priming runs backward through the layers above the frozen ones, every weight loaded.
    loading = base + weights + _activation_mib(config, PRIMING_MICRO_BATCH, max_length, trained_layers, True)
    freed = layer * trained.frozen_layers

    def held_gradients(micro: int) -> float:
        # AdamW steps each block as its gradient completes, in the last micro-batch's backward: with more than
        # one micro-batch, the earlier ones' gradients are held until then (fp32, 4 bytes a trained value).
        return trained_values(config, trained) * 4 / MIB if backward and micro < batch_size else 0.0

    def with_every_weight(micro: int) -> float:
        # Training with the bottom's weights still loaded: where the disk has no room for its states.
        activations = _activation_mib(config, micro, max_length, trained_layers, backward)
        return base + weights + state + held_gradients(micro) + activations

    def estimate(micro: int) -> float:
        return max(loading, with_every_weight(micro) - freed)

    minimum = math.ceil(min(estimate(micro) for micro in range(1, batch_size + 1)))
    if budget_mib < minimum:
        raise MemoryBudgetError(
            f"a memory budget of {budget_mib:g} MiB cannot fit this run: it needs {minimum} MiB at least (the model's "
            f"weights {weights:.0f} MiB, the {optimizer} state {state:.0f} MiB, one chunk of {max_length} tokens at a "
            f"time). Give --memory-budget {minimum} or more, a smaller --max-length, or --optimizer mezo",
            minimum,
        )
    for micro in range(batch_size, 0, -1):
        if estimate(micro) <= budget_mib:
            # Kept in memory, the states come on top of every weight: what the budget leaves then.
            cache = max(0.0, min(PREFIX_CACHE_MIB, budget_mib - with_every_weight(micro)))
            return TextMemoryPlan(int(budget_mib), math.ceil(estimate(micro)), minimum, micro, cache)
    raise AssertionError("unreachable: one chunk fits")
