"""`plan_memory`: fit a fine-tuning run under a whole-process memory budget, or say the smallest that fits.

A phone kills a process that crosses its limit, so the budget bounds the whole process's peak
resident set (what `/usr/bin/time -v` reports, priming and evaluation included), not one tensor.
The estimate is a sum of parts, each from the model's config (no model is loaded to plan):

    peak = base + weights + max(priming, training)
    + evaluation (measured on top of training's high-water mark, not in its freed room)
    phase = optimizer state and gradients of what it trains + backward activations

`base` (imports, tokenised data, the allocator's slack) and the activation factor are calibrated by
experiments/memory_budget.py on MiniLM runs measured with /usr/bin/time -v. Activations are those of a
batch padded to the full sequence length: the planner cannot know the data's lengths before it loads.

The levers, cheapest first: frozen embeddings from the first step (FAR with
`freeze_embeddings=True` freezes them at the surgery anyway; priming then skips their gradient and
AdamW state), recomputed learner activations (`FARConfig.recompute_activations`), then smaller
micro-batches with gradient accumulation (same examples per optimizer step) and smaller evaluation
batches.

    >>> shape = ModelShape(params=22_700_000, embedding_params=11_900_000, ffn_params=7_100_000,
    ...                    hidden=384, layers=6, ffn=1536, heads=12)
    >>> plan_memory(1500, shape, batch_size=32, seq_len=128, far=None).micro_batch
    8
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from far.config import FARConfig

MIB = 2**20
# Calibration (MiniLM, `far train` on 128-token pairs, AMD EPYC with avx512_bf16, torch 2.x, see
# experiments/results/memory_budget): the process before training (imports ~477 MiB, tokenised data,
# tokenizer, allocator) and the measured activations over the count of `_activation_floats`.
BASE_MIB = 559.0
ACTIVATION_FACTOR = 1.26
# Inference keeps about one layer's tensors at a time; measured 2.85 MiB per 128-token MiniLM example, on
# top of the training's high-water mark (what training freed is not where evaluation's tensors go).
EVAL_FACTOR = 1.0
# Bytes per trainable parameter beyond its weight: gradient (4) + AdamW's two moments (8).
STATE_BYTES = {"adamw": 12, "sgd": 4, "mezo": 0}


class MemoryBudgetError(ValueError):
    """A budget that no plan fits; `minimum_mib` is the smallest budget that does."""

    def __init__(self, message: str, minimum_mib: int) -> None:
        super().__init__(message)
        self.minimum_mib = minimum_mib


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a transformer encoder, from its config."""

    params: int
    embedding_params: int
    ffn_params: int
    hidden: int
    layers: int
    ffn: int
    heads: int

    @classmethod
    def from_config(cls, config: object) -> ModelShape:
        """From a transformers config (or its `to_dict()`/config.json as a dict): BERT-style field names."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        h, n, f = get("hidden_size"), get("num_hidden_layers"), get("intermediate_size")
        heads, vocab = get("num_attention_heads"), get("vocab_size")
        if None in (h, n, f, heads, vocab):
            raise ValueError(
                "the memory budget needs hidden_size, num_hidden_layers, intermediate_size, num_attention_heads "
                "and vocab_size in the model's config"
            )
        positions, types = get("max_position_embeddings", 0) or 0, get("type_vocab_size", 0) or 0
        embedding = (vocab + positions + types) * h + 2 * h
        ffn = 2 * h * f + f + h
        layer = 4 * h * h + 4 * h + ffn + 4 * h  # attention, FFN, two LayerNorms
        return cls(embedding + n * layer + h * h + h, embedding, n * ffn, h, n, f, heads)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        """From a Hugging Face model folder's config.json, without importing transformers."""
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text()))


@dataclass(frozen=True)
class MemoryPlan:
    """How a run fits `budget_mib`: batches of `batch_size` examples as `accumulation` micro-batches."""

    budget_mib: int
    batch_size: int
    micro_batch: int
    accumulation: int
    early_frozen_embeddings: bool
    recompute_activations: bool
    eval_batch_size: int
    estimate_mib: int

    def describe(self) -> str:
        levers = [
            name
            for name, on in (
                ("embeddings frozen from the first step", self.early_frozen_embeddings),
                ("recomputed learner activations", self.recompute_activations),
            )
            if on
        ]
        return (
            f"memory plan for {self.budget_mib} MiB: micro-batch {self.micro_batch} x {self.accumulation} accumulated "
            f"(batch {self.batch_size}), evaluation batch {self.eval_batch_size}, "
            f"{', '.join(levers) or 'no other lever'}; estimated peak {self.estimate_mib} MiB"
        )


def _activation_floats(shape: ModelShape, seq_len: int, ffn_kept: float) -> float:
    """Floats one example keeps for backward, all layers (fp32): per token ~11 hidden-wide tensors and
    2 FFN-wide ones (`ffn_kept` of them under FAR), per head ~3 (L, L) maps (scores, dropout, mask)."""
    per_layer = seq_len * (11 * shape.hidden + 2 * ffn_kept * shape.ffn) + 3 * shape.heads * seq_len**2
    return shape.layers * per_layer


def _eval_floats(shape: ModelShape, seq_len: int) -> float:
    # (B, L, ffn) + a few (B, L, h) and (B, heads, L, L): one layer's at a time, no graph.
    return seq_len * (shape.ffn + 4 * shape.hidden) + 2 * shape.heads * seq_len**2


def estimate_mib(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    eval_batch_size: int,
    far: FARConfig | None,
    freeze_embeddings: bool = False,
    optimizer: str = "adamw",
    priming_optimizer: str | None = "adamw",
    early_frozen_embeddings: bool = False,
    recompute: bool = False,
) -> float:
    """The estimated whole-process peak (MiB) of one plan; see the module's docstring for the parts."""
    weights = 4 * shape.params
    evaluation = EVAL_FACTOR * 4 * eval_batch_size * _eval_floats(shape, seq_len)
    full_act = ACTIVATION_FACTOR * 4 * micro_batch * _activation_floats(shape, seq_len, 1.0)
    frozen = shape.embedding_params if freeze_embeddings else 0
    if far is None:
        trainable = shape.params - frozen
        act = 0.0 if optimizer == "mezo" else full_act
        phases = [STATE_BYTES[optimizer] * trainable + act]
    else:
        kept = far.retention / (2 if recompute else 1)
        far_act = ACTIVATION_FACTOR * 4 * micro_batch * _activation_floats(shape, seq_len, kept)
        trainable = (
            shape.params - shape.embedding_params * far.freeze_embeddings - shape.ffn_params * (1 - far.retention)
        )
        phases = [STATE_BYTES[optimizer] * trainable + (0.0 if optimizer == "mezo" else far_act)]
        if priming_optimizer is not None:
            primed = shape.params - (shape.embedding_params if early_frozen_embeddings else 0)
            snapshot = 4 * shape.ffn_params  # far.Primer's copy of the FFNs
            act = 0.0 if priming_optimizer == "mezo" else full_act
            phases.append(STATE_BYTES[priming_optimizer] * primed + snapshot + act)
    return BASE_MIB + (weights + max(phases) + evaluation) / MIB


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def plan_memory(
    budget_mib: float,
    shape: ModelShape,
    *,
    batch_size: int,
    seq_len: int,
    far: FARConfig | None,
    freeze_embeddings: bool = False,
    optimizer: str = "adamw",
    priming_optimizer: str | None = "adamw",
    eval_batch_size: int = 64,
) -> MemoryPlan:
    """The largest micro-batch (a divisor of `batch_size`, so that micro-batches are equal and their mean
    loss is the batch's) and the cheapest levers that fit `budget_mib`; more budget never gives less.

    Raises:
        MemoryBudgetError: nothing fits; the message and `minimum_mib` say the smallest budget that does.
    """
    if not (isinstance(budget_mib, (int, float)) and budget_mib > 0):
        raise ValueError(f"the memory budget must be a positive number of MiB, got {budget_mib!r}")
    if far is not None and far.freeze_embeddings:
        freeze_embeddings = True
    # (early-frozen embeddings, recompute), cheapest first: each adds to the ones before it.
    levers = [(False, False)]
    if far is not None and far.freeze_embeddings and priming_optimizer is not None:
        levers.append((True, False))
    if far is not None and not far.recompute_activations:
        levers.append((levers[-1][0], True))
    common = dict(
        far=far, freeze_embeddings=freeze_embeddings, optimizer=optimizer, priming_optimizer=priming_optimizer
    )
    evals = _divisors_desc(eval_batch_size)
    for micro in _divisors_desc(batch_size):
        for early_on, recompute_on in levers:
            for eval_batch in evals:
                peak = estimate_mib(
                    shape,
                    seq_len=seq_len,
                    micro_batch=micro,
                    eval_batch_size=eval_batch,
                    early_frozen_embeddings=early_on,
                    recompute=recompute_on,
                    **common,
                )
                if peak <= budget_mib:
                    return MemoryPlan(
                        int(budget_mib),
                        batch_size,
                        micro,
                        batch_size // micro,
                        early_on,
                        recompute_on or (far is not None and far.recompute_activations),
                        eval_batch,
                        math.ceil(peak),
                    )
    least = levers[-1]
    minimum = math.ceil(
        estimate_mib(
            shape,
            seq_len=seq_len,
            micro_batch=1,
            eval_batch_size=1,
            early_frozen_embeddings=least[0],
            recompute=least[1],
            **common,
        )
    )
    raise MemoryBudgetError(
        f"--memory-budget {budget_mib:g} MiB cannot fit this run (model of {shape.params:,} parameters, "
        f"{seq_len}-token sequences) even with micro-batches of 1; the smallest that fits is {minimum} MiB",
        minimum,
    )


def peak_rss_mib() -> int:
    """This process's peak resident set so far (VmHWM), in MiB; 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0
