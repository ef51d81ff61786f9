"""`plan_memory`: fit a fine-tuning run under a whole-process memory budget, or say the smallest that fits.

A phone kills a process that crosses its limit, so the budget bounds the whole process's peak
resident set (what `/usr/bin/time -v` reports, priming and evaluation included), not one tensor.
The estimate is a sum of parts, each from the model's config (no model is loaded to plan):

    peak = base + weights + max(priming, training) + evaluation
    phase = optimizer state and gradients of what it trains + backward activations of one micro-batch

`base` is the process without the model: imports (torch; transformers' model code, or not with the
lean encoder runtime; torch._dynamo, which the first torch.optim optimizer imports: far's AdamW does
not, MeZO and SGD do), tokenizer and data. The command line plans before anything loads, from
calibrated constants (`BASE_MIB`); `far.finetune` plans with the model loaded, from the process's
resident memory at that moment.

The levers, cheapest first: micro-batches of at most so many padded tokens, accumulated (the same
examples per optimizer step; `far.training.batches.split_batch`), frozen embeddings from the first step
(FAR with `freeze_embeddings` already does it), recomputed learner activations
(`FARConfig.recompute_activations`), then recomputed layers (each layer's activations rebuilt in
backward: ~1.4x the step) and smaller evaluation batches. The plan is the one that fits with the least
estimated step time.

    >>> shape = ModelShape.from_config(config)
    >>> plan_memory(1500, shape, base_mib=BASE_MIB["lean"], batch_size=32, seq_len=128, far=None).micro_tokens
    1024
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from far.config import FARConfig
from far.hardware import peak_rss_bytes
from far.training.options import TrainOptions

MIB = 2**20
# Calibration (MiniLM, `far train` on STS-B pairs, AMD EPYC with avx512_bf16, torch 2.13, glibc's mmap
# threshold pinned as `far.training.memory.release_freed_memory` pins it; experiments/results/memory_budget): the
# process without the model's weights, once training has begun with far's AdamW. transformers' model code
# imports torch._dynamo itself.
BASE_MIB = {"transformers": 420.0, "lean": 330.0}
# What importing torch._dynamo adds (a torch.optim optimizer's first parameter group does it: MeZO, SGD), and
# `datasets` with pandas and pyarrow (GLUE's and SQuAD's loaders; `far train` reads its files without it).
DYNAMO_MIB = 73.0
DYNAMO_OPTIMIZERS = ("mezo", "sgd")
DATASETS_MIB = 115.0
# What the first training step allocates for good (oneDNN's compiled kernels and scratch, thread pools), which a
# process measured before training has not yet.
FIRST_STEP_MIB = 40.0
# Measured activations over the count of `_activation_floats`.
ACTIVATION_FACTOR = 1.26
# Inference keeps about one layer's tensors at a time (2.85 MiB per 128-token MiniLM example).
EVAL_FACTOR = 1.0
# Bytes per trainable parameter beyond its weight: gradient (4) + AdamW's two moments (8).
STATE_BYTES = {"adamw": 12, "sgd": 4, "mezo": 0}
# Step time against the padded tokens of a micro-batch, relative to whole batches of 32 x 128 (MiniLM,
# full fine-tuning, one thread); and the factor of recomputing every layer in backward.
TOKEN_TIME = ((4096, 1.0), (1024, 1.15), (512, 1.32), (256, 1.43), (128, 1.47))
RECOMPUTE_LAYERS_TIME = 1.4


# The estimate's parts are an encoder's (BERT-style config fields, one pass over the whole sequence). A causal LM's
# budget is planned from its GGUF file by the run on texts (far.llm.text_budget); a prompted run takes none.
ENCODERS_ONLY = (
    "this memory budget plans encoder runs; a causal LM's budget is planned by its lean runtime, for a run on texts: "
    "far train --model GGUF --train-file TEXTS --memory-budget MIB (in Python, TextRun(..., memory_budget=MIB) "
    "beside settings without one). Leave the budget out of this run"
)


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
    """How a run fits `budget_mib`: micro-batches of at most `micro_tokens` padded tokens (None: whole batches)."""

    budget_mib: int
    batch_size: int
    seq_len: int
    micro_tokens: int | None
    early_frozen_embeddings: bool
    recompute_activations: bool
    recompute_layers: bool
    eval_batch_size: int
    estimate_mib: int

    def describe(self) -> str:
        """One line: the budget, how batches are split, the evaluation batch, the levers and the estimate."""
        levers = [
            name
            for name, on in (
                ("embeddings frozen from the first step", self.early_frozen_embeddings),
                ("recomputed learner activations", self.recompute_activations),
                ("recomputed layers", self.recompute_layers),
            )
            if on
        ]
        split = (
            "whole batches"
            if self.micro_tokens is None
            else f"micro-batches of at most {self.micro_tokens} tokens (batch {self.batch_size} x {self.seq_len})"
        )
        return (
            f"memory plan for {self.budget_mib} MiB: {split}, evaluation batch {self.eval_batch_size}, "
            f"{', '.join(levers) or 'no other lever'}; estimated peak {self.estimate_mib} MiB"
        )


def _activation_floats(shape: ModelShape, seq_len: int, ffn_kept: float) -> float:
    """Floats one example keeps for backward, all layers (fp32): per token ~11 hidden-wide tensors and
    2 FFN-wide ones (`ffn_kept` of them under FAR), per head ~3 (L, L) maps (scores, dropout, mask)."""
    per_layer = seq_len * (11 * shape.hidden + 2 * ffn_kept * shape.ffn) + 3 * shape.heads * seq_len**2
    return shape.layers * per_layer


def _micro_batch_floats(shape: ModelShape, seq_len: int, tokens: int, ffn_kept: float, recompute_layers: bool) -> float:
    """Floats kept for backward by a micro-batch of `tokens` padded tokens, examples of up to `seq_len`."""
    examples = max(tokens, seq_len) / seq_len
    full = _activation_floats(shape, seq_len, ffn_kept)
    if recompute_layers:  # each layer's input, and one layer's activations while it is recomputed
        return examples * (shape.layers * seq_len * shape.hidden + full / shape.layers)
    return examples * full


def _eval_floats(shape: ModelShape, seq_len: int) -> float:
    # (B, L, ffn) + a few (B, L, h) and (B, heads, L, L): one layer's at a time, no graph.
    return seq_len * (shape.ffn + 4 * shape.hidden) + 2 * shape.heads * seq_len**2


def estimate_mib(
    shape: ModelShape,
    *,
    base_mib: float,
    seq_len: int,
    micro_tokens: int,
    eval_batch_size: int,
    far: FARConfig | None,
    freeze_embeddings: bool = False,
    optimizer: str = "adamw",
    priming_optimizer: str | None = "adamw",
    early_frozen_embeddings: bool = False,
    recompute: bool = False,
    recompute_layers: bool = False,
    primer_copy: bool = True,
) -> float:
    """The estimated whole-process peak (MiB) of one plan; see the module's docstring for the parts.

    `primer_copy`: whether priming keeps a copy of the FFNs (False: it reads their stock values from
    the model's file, `far.Primer(reference=...)`).
    """
    weights = 4 * shape.params
    evaluation = EVAL_FACTOR * 4 * eval_batch_size * _eval_floats(shape, seq_len)

    def act(kept: float) -> float:
        return ACTIVATION_FACTOR * 4 * _micro_batch_floats(shape, seq_len, micro_tokens, kept, recompute_layers)

    # Accumulating a micro-batch's gradient into the step's allocates the new gradient of one tensor at a time:
    # the word embedding's (dense, vocab x hidden) where it trains, else a layer's largest matrix.
    matrix = 4 * shape.hidden * max(shape.ffn, shape.hidden)

    def phase(name: str, trained: float, kept: float, embeddings_train: bool, extra: float = 0.0) -> float:
        # optimizer state of what trains (+ `extra`) + backward's activations and accumulated gradient, if any
        first_order = (
            0.0 if name == "mezo" else act(kept) + (4 * shape.embedding_params if embeddings_train else matrix)
        )
        return STATE_BYTES[name] * trained + extra + first_order

    if far is None:
        frozen = shape.embedding_params if freeze_embeddings else 0
        phases = [phase(optimizer, shape.params - frozen, 1.0, not freeze_embeddings)]
    else:
        trainable = (
            shape.params - shape.embedding_params * far.freeze_embeddings - shape.ffn_params * (1 - far.retention)
        )
        phases = [phase(optimizer, trainable, far.retention / (2 if recompute else 1), not far.freeze_embeddings)]
        if priming_optimizer is not None:
            primed = shape.params - (shape.embedding_params if early_frozen_embeddings else 0)
            snapshot = 4 * shape.ffn_params if primer_copy else 0.0
            phases.append(phase(priming_optimizer, primed, 1.0, not early_frozen_embeddings, snapshot))
    return base_mib + (weights + max(phases) + evaluation) / MIB


def _token_time(tokens: int) -> float:
    """Relative step time of micro-batches of `tokens` padded tokens (`TOKEN_TIME`, interpolated in log2)."""
    points = sorted(TOKEN_TIME)
    if tokens <= points[0][0]:
        return points[0][1]
    for (t0, f0), (t1, f1) in zip(points, points[1:], strict=False):
        if tokens <= t1:
            w = math.log2(tokens / t0) / math.log2(t1 / t0)
            return f0 + w * (f1 - f0)
    return points[-1][1]


def imports_dynamo(*optimizers: str | None) -> bool:
    """Whether a run with these optimizers imports torch._dynamo (a torch.optim optimizer: MeZO, SGD)."""
    return any(name in DYNAMO_OPTIMIZERS for name in optimizers)


def process_base_mib(resident_mib: float, model_bytes: int, dynamo: bool) -> float:
    """The base of a plan made inside a running process: what it holds now without the model's weights, plus
    torch._dynamo's import where the run will import it (`dynamo`) and nothing has yet, plus the first step's."""
    later = dynamo and "torch._dynamo" not in sys.modules
    return resident_mib - model_bytes / MIB + (DYNAMO_MIB if later else 0.0) + FIRST_STEP_MIB


def plan_memory(
    budget_mib: float,
    shape: ModelShape,
    *,
    base_mib: float,
    batch_size: int,
    seq_len: int,
    far: FARConfig | None,
    freeze_embeddings: bool = False,
    optimizer: str = "adamw",
    priming_optimizer: str | None = "adamw",
    eval_batch_size: int = 64,
    early_frozen_embeddings: bool = False,
    primer_copy: bool = True,
) -> MemoryPlan:
    """The plan of least estimated step time that fits `budget_mib`: micro-batches of a power-of-two
    multiple of `seq_len` tokens, then FAR's levers and layer recompute, then the evaluation batch.
    More budget never gives a slower plan.

    Args:
        base_mib: The process without the model's weights (`BASE_MIB[runtime]`, or `process_base_mib`).
        seq_len: The longest example (every micro-batch is sized as if padded to it).
        early_frozen_embeddings: The run freezes its FARConfig's embeddings from the first step anyway.

    Raises:
        MemoryBudgetError: nothing fits; the message and `minimum_mib` say the smallest budget that does.
    """
    if not (isinstance(budget_mib, (int, float)) and budget_mib > 0):
        raise ValueError(f"the memory budget must be a positive number of MiB, got {budget_mib!r}")
    if far is not None and far.freeze_embeddings:
        freeze_embeddings = True
    # (early-frozen embeddings, FAR's recompute, layer recompute), cheapest first, each adding to the ones before.
    early = early_frozen_embeddings or (far is not None and far.freeze_embeddings and priming_optimizer is None)
    levers = [(early, False, False)]
    if far is not None and far.freeze_embeddings and priming_optimizer is not None and not early:
        levers.append((True, False, False))
    if far is not None and not far.recompute_activations:
        levers.append((levers[-1][0], True, False))
    if optimizer != "mezo":
        levers.append((levers[-1][0], levers[-1][1], True))
    common = dict(
        base_mib=base_mib,
        seq_len=seq_len,
        far=far,
        freeze_embeddings=freeze_embeddings,
        optimizer=optimizer,
        priming_optimizer=priming_optimizer,
        primer_copy=primer_copy,
    )
    whole = batch_size * seq_len
    sizes = sorted({min(whole, seq_len * 2**k) for k in range(max(1, batch_size).bit_length() + 1)}, reverse=True)
    evals = [d for d in range(eval_batch_size, 0, -1) if eval_batch_size % d == 0]

    def peak(tokens: int, eval_batch: int, lever: tuple[bool, bool, bool]) -> float:
        early_on, recompute_on, layers_on = lever
        return estimate_mib(
            shape,
            micro_tokens=tokens,
            eval_batch_size=eval_batch,
            early_frozen_embeddings=early_on,
            recompute=recompute_on,
            recompute_layers=layers_on,
            **common,
        )

    best: tuple[float, MemoryPlan] | None = None
    for tokens in sizes:
        for lever in levers:
            early_on, recompute_on, layers_on = lever
            time = _token_time(tokens) * (RECOMPUTE_LAYERS_TIME if layers_on else 1.0)
            if best is not None and time >= best[0]:
                continue
            for eval_batch in evals:
                estimate = peak(tokens, eval_batch, lever)
                if estimate <= budget_mib:
                    plan = MemoryPlan(
                        int(budget_mib),
                        batch_size,
                        seq_len,
                        None if tokens >= whole else tokens,
                        early_on,
                        recompute_on or (far is not None and far.recompute_activations),
                        layers_on,
                        eval_batch,
                        math.ceil(estimate),
                    )
                    best = (time, plan)
                    break
    if best is not None:
        return best[1]
    minimum = math.ceil(peak(seq_len, 1, levers[-1]))
    raise MemoryBudgetError(
        f"--memory-budget {budget_mib:g} MiB cannot fit this run (model of {shape.params:,} parameters, "
        f"{seq_len}-token sequences) even one example at a time; the smallest that fits is {minimum} MiB",
        minimum,
    )


def plan_run_memory(
    options: TrainOptions, shape: ModelShape, *, base_mib: float, seq_len: int, primer_copy: bool
) -> MemoryPlan:
    """The memory plan of a run with these options: the one call that the command line (before anything
    loads) and `far.finetune` (with the model loaded) both make, so that they plan the same run.

    What priming trains comes from the options' own rules (`TrainOptions.primes`, `frozen_from_start`);
    `options.memory_budget` must be set.
    """
    if options.memory_budget is None:
        raise ValueError("plan_run_memory needs options with a memory_budget")
    return plan_memory(
        options.memory_budget,
        shape,
        base_mib=base_mib,
        batch_size=options.batch_size,
        seq_len=seq_len,
        far=options.config,
        freeze_embeddings=options.embeddings_frozen,
        optimizer=options.optimizer,
        priming_optimizer=options.active_priming_optimizer,
        eval_batch_size=options.eval_batch_size,
        early_frozen_embeddings=options.frozen_from_start,
        primer_copy=primer_copy,
    )


def resident_mib() -> float:
    """This process's resident set now, in MiB; 0 where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / MIB
    except OSError:
        return 0.0


def peak_rss_mib() -> int:
    """This process's peak resident set so far, in MiB."""
    return peak_rss_bytes() // MIB
