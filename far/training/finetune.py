"""`far.finetune`: priming, selection, surgery and training in one call."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn
from transformers import default_data_collator

from far.architectures import CAUSAL_LM_TYPES, FFNSpec, find_attention, find_ffns
from far.config import PRESETS, UNSET, FARConfig
from far.freezing import find_layers
from far.saving.shared_layout import SharedLayout, check_layout, read_shared_layout
from far.surgery.state import is_reconfigured
from far.training.batches import BatchStream, longest_example
from far.training.budget import (
    ENCODERS_ONLY,
    MemoryBudgetError,
    ModelShape,
    imports_dynamo,
    plan_run_memory,
    process_base_mib,
    resident_mib,
)
from far.training.checkpoint import has_run, read_checkpoint
from far.training.distributed import Parallel
from far.training.loop import Loop
from far.training.losses import EvalFn, LossFn, default_loss
from far.training.memory import release_freed_memory
from far.training.options import OPTION_NAMES, TrainOptions
from far.training.plan import plan_training
from far.training.recompute import can_recompute_layers, recompute_layers, recomputes_layers
from far.training.result import FinetuneResult

logger = logging.getLogger(__name__)


def _check_data(train_data: object) -> int:
    if not (hasattr(train_data, "__len__") and hasattr(train_data, "__getitem__")):
        raise TypeError(
            f"train_data must be a map-style dataset (len() and [i]: a list, a torch Dataset, a datasets.Dataset), "
            f"got {type(train_data).__name__}"
        )
    n = len(train_data)
    if n == 0:
        raise ValueError("train_data is empty: there is nothing to train on")
    return n


def named_config(
    config: object, cache_frozen: bool | None, *, seed: int, freeze_embeddings: bool, memory_budget: float | None
) -> tuple[object, bool]:
    """A `far.finetune` call's `config` and `cache_frozen` with a configuration's name resolved: `"auto"` is
    `FARConfig.auto()` with the frozen bottom kept, `"paper"` `FARConfig.paper()`; `cache_frozen` left None keeps
    the frozen bottom's output where a named configuration freezes one (off otherwise). Any other `config` is
    returned as it is."""
    if not isinstance(config, str):
        return config, bool(cache_frozen)
    if config not in PRESETS:
        raise TypeError(
            f"config={config!r} names no configuration: the named ones are {', '.join(map(repr, PRESETS))}; else pass "
            "a far.FARConfig, None (no surgery) or a retention (the retention must be a number in (0, 1], e.g. 0.4)"
        )
    if config == "auto" and memory_budget is not None:
        raise ValueError(
            "config='auto' chooses the retention and the depth from the priming scores and keeps the frozen bottom's "
            "output, which the memory budget does not plan for: give config='paper' (a fixed retention) with "
            "memory_budget, or no budget"
        )
    embeddings = {"freeze_embeddings": True} if freeze_embeddings else {}
    named = FARConfig.preset(config, seed=seed, **embeddings)
    return named, named.freezes_depth if cache_frozen is None else bool(cache_frozen)


def finetune(
    model: nn.Module,
    train_data: Any,
    config: FARConfig | float | str | None = UNSET,
    *,
    options: TrainOptions | None = None,
    optimizer: str = "adamw",
    priming: float | int = 0.1,
    priming_optimizer: str = "adamw",
    priming_lr: float | None = None,
    priming_scores: str = "change",
    freeze_embeddings: bool = False,
    freeze_ffn: bool = False,
    epochs: float = 1.0,
    max_steps: int | None = None,
    lr: float | None = None,
    batch_size: int = 32,
    warmup: float | int = 0.0,
    weight_decay: float = 0.0,
    grad_accum: int = 1,
    max_grad_norm: float | None = 1.0,
    bf16: bool = False,
    precision: str | None = None,
    collate_fn: Callable[[list], Any] | None = None,
    loss_fn: LossFn | None = None,
    eval_fn: EvalFn | None = None,
    eval_every: int | None = None,
    seed: int = 0,
    output_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int | None = 2,
    resume_from: str | os.PathLike | None = None,
    mezo_eps: float = 1e-3,
    mezo_directions: int = 1,
    log_every: int = 1,
    spec: FFNSpec | None = None,
    progress: bool = True,
    reset_frozen: bool = True,
    prime_frozen: bool | None = None,
    freeze_layers: int | None = None,
    cache_frozen: bool | None = None,
    cache_frozen_mib: float = 1024.0,
    group_by_length: bool = False,
    memory_budget: float | None = None,
    max_length: int = 128,
    eval_batch_size: int = 64,
    base_weights: Callable[[str], Tensor] | None = None,
    layout: str | os.PathLike | SharedLayout | None = None,
    stop_after_priming: bool = False,
    parallel: Parallel | None = None,
    **deprecated: Any,
) -> FinetuneResult:
    """Prime, select learners, reconfigure and train `model`, in place, with AdamW or MeZO.

    The run: the first `priming` steps train the whole model with `priming_optimizer` while a
    `far.Primer` watches the FFNs; then `far.reconfigure` splits every FFN, keeping `retention` of
    its nodes trainable, and the remaining steps train only what is trainable with `optimizer`.
    Priming's weight changes are kept (they are ordinary fine-tuning steps). The priming
    optimizer's state is dropped at the switch, the learners' moments included: the training
    optimizer starts fresh over the trainable tensors only. The model is returned reconfigured;
    `far.restore(model)` merges it back.

    One learning-rate schedule spans the whole run, priming included: linear warmup over `warmup`
    then linear decay to zero at the last step; each phase scales it by its own base rate.

    With `optimizer="mezo"` the steps are MeZO's (two forward passes, no backward, memory of
    inference) and the model is kept in eval mode (no dropout between the two passes); with
    `grad_accum=k` one MeZO step evaluates the loss over k batches. Priming still uses AdamW unless
    `priming_optimizer` says otherwise: "sgd" (plain SGD, no state) or "mezo" (inference memory,
    noisier priming scores) fit tighter memory budgets.

    Args:
        model: A Hugging Face (or any) model; the default `loss_fn` needs `model(**batch).loss`.
        train_data: Map-style dataset of examples (a list, a torch `Dataset`, a `datasets.Dataset`).
        config: The surgery, as for `far.reconfigure`: a `far.FARConfig`, a number (the retention:
            `FARConfig(retention, seed=seed, freeze_embeddings=freeze_embeddings)`), or None for no
            surgery (full fine-tuning: no priming, the same loop otherwise), or a configuration's name:
            `"auto"`, FAR's automatic configuration (`FARConfig.auto()`, with `cache_frozen` on: what
            `far glue --method far` runs), or `"paper"` (`FARConfig.paper()`, retention 0.4). Left out:
            `FARConfig()`, the paper's. The config travels whole to the surgery; its `selection="random"`
            needs no priming.
        options: Every option below at once, as a `far.training.TrainOptions` built (and checked)
            beforehand, the config included; then no other option may be given.
        priming: Priming length: a fraction of the run's steps in [0, 1), or a number of steps.
        priming_optimizer: "adamw" (default), "sgd" or "mezo".
        priming_lr: Base LR of priming; default `lr` if the optimizers match, else the priming
            optimizer's default.
        priming_scores: "change" (default): nodes scored by how far the priming steps moved them.
            "gradient": by their weights' gradient L1 over the batches of the first `priming` steps,
            computed before step 0 without an update (`far.training.gradient_priming`); no weight moves,
            nothing is snapshotted, and every step of the run trains the reconfigured model.
        freeze_embeddings: Also freeze every `nn.Embedding` (with a `FARConfig`, set its field instead).
        freeze_ffn: With config=None: freeze every FFN (the freeze-FFN ablation).
        epochs: Passes over `train_data` (fractions allowed); ignored when `max_steps` is set.
        max_steps: Optimizer steps of the whole run (priming included).
        lr: Base LR of training; None picks 5e-5 (adamw), 1e-3 (sgd) or 1e-6 (mezo).
        batch_size: Examples per batch.
        warmup: Warmup length: a fraction of the steps in [0, 1), or a number of steps.
        weight_decay: Decoupled weight decay for tensors of 2 or more dimensions (not biases, norms).
        grad_accum: Batches per optimizer step.
        max_grad_norm: Gradient clipping of first-order steps; None or 0 turns it off.
        bf16: Run forward passes under `torch.autocast(dtype=torch.bfloat16)`; the same as precision="bf16".
        precision: "fp32", "bf16" (autocast), or "auto": bf16 where the hardware multiplies it natively (a CPU
            with avx512_bf16 or amx_bf16, a CUDA GPU with bf16), fp32 elsewhere (`far.training.precision`; `--precision
            auto`). None (default): what `bf16` says, fp32 unless it is True, so that a call
            computes the same on every machine unless asked. The result's `precision` says which ran and why.
        collate_fn: Makes a batch from a list of examples; default `transformers.default_data_collator`.
        loss_fn: `loss_fn(model, batch) -> scalar tensor`; default `model(**batch).loss`.
        eval_fn: `eval_fn(model) -> dict[str, float]`, run in eval mode under no_grad every
            `eval_every` steps and at the end.
        eval_every: Steps between evaluations (None: only at the end).
        seed: Seeds the data order, dropout (on a forked RNG: the caller's RNG state is left as
            it was), random selection and MeZO's directions.
        output_dir: Where `log.jsonl` (one JSON line per step: step, phase, loss, lr, eval metrics,
            elapsed seconds, peak RSS), `result.json` and `checkpoints/` go.
        checkpoint_every: Write a checkpoint every that many steps and at the end (needs
            `output_dir`). Checkpoints fall on steps after priming only.
        keep_checkpoints: How many checkpoints to keep (None: all).
        resume_from: A checkpoint (or a run's `output_dir`) to continue from, with the same
            options: the final weights are those of an uninterrupted run (bitwise with MeZO). Pass
            the same plain model you started with; its FAR layout is rebuilt from the checkpoint.
        mezo_eps: MeZO's perturbation scale.
        mezo_directions: MeZO directions averaged per step.
        log_every: Steps between log lines (evaluations and the last step are always logged).
        spec: FFN layout for architectures far does not know (see `far.FFNSpec`).
        progress: Show a tqdm progress bar (steps/s, loss).
        reset_frozen: At the switch, put every frozen node, head and embedding back to its
            pre-priming value (see `far.reconfigure`), so that `far.save_learners` writes a file
            for the stock model. False keeps the primed values (the file fits only the primed model).
        prime_frozen: Whether priming trains what the config freezes up front (its embeddings, a fixed
            `freeze_layers`). None (default): not with `reset_frozen`, which would put those values
            back anyway; they are then frozen from the first step and priming costs what training
            does there. True: primed like the rest (the FAR paper primes the whole model).
        freeze_layers: With config=None: freeze the embeddings and the bottom K layers whole
            (`far.freeze_layers`), the practitioner's baseline; with a config, set its field instead.
        cache_frozen: None (default): on with `config="auto"`, else off. True: run the frozen bottom (the
            embeddings and the bottom K layers) without dropout and keep
            its output per training example (`far.training.frozen_bottom`): once an example has been seen, its
            steps run the layers above K only. Needs a frozen depth (`freeze_layers`, in the config or here),
            batches that are right-padded mappings of tensors, and a `loss_fn` that runs the model's layers.
        cache_frozen_mib: The most memory the kept states may take; examples beyond it are computed each time.
        group_by_length: Batch examples of similar lengths together (`far.training.batches`): each epoch sees
            every example once, each batch is a uniform draw in expectation, and batches pad little.
        memory_budget: Whole-process peak RSS to stay under, in MiB (`far.training.budget.plan_memory`):
            each batch is split into equal micro-batches with gradient accumulation (the same examples
            per optimizer step), and FAR's cheap levers are turned on as needed; a budget that cannot
            fit raises `MemoryBudgetError` (a ValueError) naming the smallest that does. `eval_fn`
            should evaluate in batches of at most the plan's `eval_batch_size` (the log says it).
        max_length: With `memory_budget`: the longest sequence a batch may hold; the plan sizes
            micro-batches for the longest example of `train_data`, at most this.
        eval_batch_size: With `memory_budget`: the batch `eval_fn` evaluates in, which the plan counts
            (and lowers where it must; the log says to what).
        base_weights: `base_weights(parameter_name)` -> the value the model was loaded with, read from
            its file (`far.saving.stock_reader`): priming then keeps no copy of the FFNs (a third of
            an encoder's weights) and reads them back to score nodes and to reset what it freezes.
        layout: A layout primed once and shared (`far prime`, `far.training.prime_layout`; a path or a read
            `far.saving.shared_layout.SharedLayout`): the model is split with its learners and frozen depth at
            step 0, with no priming step; its config is the run's (leave `config` out), `cache_frozen` on where
            it freezes a depth. A layout for another base or shape is refused before the model is touched.
        stop_after_priming: Run the priming phase only: the model ends reconfigured with what priming chose,
            untrained beyond it (what `far.training.prime_layout` writes out).
        parallel: This process's place in a data-parallel run under torchrun (`far.training.distributed`,
            `Parallel.from_environment()`): each process trains on its share of every batch, to the weights of one
            process; the first one writes `output_dir`. With `shard=True` the model is sharded (FSDP2) for the steps
            and comes back plain, its tensors whole. None: one process.
        **deprecated: `retention=`, `selection=` and `attention_retention=`, the config's fields as
            keywords: still accepted, with a DeprecationWarning; pass `config` instead.

    Returns:
        A `far.FinetuneResult` (final metrics, steps, time split into priming / training / eval,
        peak memory, parameter counts).

    Example:
        >>> result = far.finetune(model, train_examples, far.FARConfig(retention=0.4), epochs=3, lr=5e-5,
        ...                       eval_fn=lambda m: {"accuracy": accuracy(m)})
        >>> result.metrics, result.training_seconds
        >>> far.finetune(model, train_examples, "auto", epochs=3)  # retention and depth from priming
        >>> far.finetune(model, train_examples, optimizer="mezo", max_steps=20_000)
    """
    # Everything is checked before the model is touched.
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module (e.g. a transformers model), got {type(model).__name__}")
    n_examples = _check_data(train_data)
    for name, fn in (("collate_fn", collate_fn), ("loss_fn", loss_fn), ("eval_fn", eval_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")
    if isinstance(layout, (str, os.PathLike)):
        layout = read_shared_layout(layout)
    if isinstance(layout, SharedLayout):
        check_layout(model, layout, spec)  # another base, another shape: refused before anything changes
        config = layout.config if config is UNSET else config
        cache_frozen = layout.config.freezes_depth if cache_frozen is None else cache_frozen
    config, cache_frozen = named_config(
        config, cache_frozen, seed=seed, freeze_embeddings=freeze_embeddings, memory_budget=memory_budget
    )
    keywords = {name: value for name, value in locals().items() if name in OPTION_NAMES}
    options = TrainOptions.from_call(options, config, keywords, deprecated)
    plan = plan_training(n_examples, options)
    precision = options.precision_for(model)
    plan = dataclasses.replace(plan, bf16=precision.bf16)
    plan, memory = _plan_memory(model, plan, options, train_data, base_weights)
    _check_model_for(model, plan, spec, eval_fn)
    micro_batches = memory is not None and memory.micro_tokens is not None
    (parallel or Parallel()).check_plan({plan.optimizer, plan.priming_optimizer}, micro_batches)
    checkpoint, output_dir = _resume_or_start(model, plan, resume_from, output_dir)

    stream = BatchStream(
        train_data,
        plan.batch_size,
        collate_fn or default_data_collator,
        plan.seed,
        micro_tokens=None if memory is None else memory.micro_tokens,
        max_length=options.max_length if memory is None else memory.seq_len,
        group_by_length=plan.group_by_length,
    )
    loop = Loop(
        model,
        stream,
        plan,
        loss_fn=loss_fn or default_loss,
        eval_fn=eval_fn,
        output_dir=None if output_dir is None else Path(output_dir),
        spec=spec,
        progress=options.progress,
        base_weights=base_weights,
        parallel=parallel,
    )
    switch_recompute = memory is not None and memory.recompute_layers and not recomputes_layers(model)
    if switch_recompute:
        recompute_layers(model, True)
    try:
        logger.info("precision: %s (%s)", precision.name, precision.reason)
        result = dataclasses.replace(loop.run(checkpoint), precision=precision.to_dict())
        if memory is not None:
            result = dataclasses.replace(result, memory_plan=dataclasses.asdict(memory))
    finally:
        if switch_recompute:  # the model goes back as it came
            recompute_layers(model, False)
    return result


def _plan_memory(model: nn.Module, plan, options: TrainOptions, train_data, base_weights):
    """With `options.memory_budget`: the memory plan (`far.training.budget`) and the plan it changes; else None."""
    if options.memory_budget is None:
        return plan, None
    if getattr(getattr(model, "config", None), "model_type", None) in CAUSAL_LM_TYPES:
        raise ValueError(ENCODERS_ONLY)
    # Freed tensors go back to the system from now on, so that the peak is what is live (far.training.memory).
    release_freed_memory()
    seq_len = longest_example(train_data, options.max_length)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    memory = plan_run_memory(
        options,
        ModelShape.from_config(getattr(model, "config", None)),
        base_mib=process_base_mib(resident_mib(), model_bytes, imports_dynamo(plan.optimizer, plan.priming_optimizer)),
        seq_len=seq_len,
        primer_copy=base_weights is None,
    )
    logger.info("%s", memory.describe())
    far_config = plan.far
    if far_config is not None and memory.recompute_activations:
        far_config = dataclasses.replace(far_config, recompute_activations=True)
    plan = dataclasses.replace(
        plan, far=far_config, frozen_from_start=plan.frozen_from_start or memory.early_frozen_embeddings
    )
    if memory.recompute_layers and not can_recompute_layers(model):
        raise MemoryBudgetError(
            f"--memory-budget {options.memory_budget:g} MiB needs each layer recomputed in backward, and this "
            "model cannot recompute its layers (no activation_checkpointing_enable()); give a larger budget",
            memory.estimate_mib,
        )
    return plan, memory


def _check_model_for(model: nn.Module, plan, spec: FFNSpec | None, eval_fn) -> None:
    """What the plan needs of the model and the call, checked before the model is touched."""
    if plan.cache_frozen and plan.far is None and plan.freeze_layers >= len(find_layers(model, spec)):
        raise ValueError(
            f"freeze_layers={plan.freeze_layers} freezes every layer, so nothing above the cached bottom trains; "
            "freeze fewer layers, or leave cache_frozen off"
        )
    if plan.eval_every is not None and eval_fn is None:
        raise ValueError("eval_every needs an eval_fn(model) -> dict of metrics")
    if plan.far is not None or plan.freeze_ffn:
        find_ffns(model, spec)  # a clear error for an architecture far does not know
    if plan.far is not None and plan.far.attention_retention is not None:
        find_attention(model)  # ... or whose heads it cannot split


def _resume_or_start(model: nn.Module, plan, resume_from, output_dir):
    """The checkpoint a resumed run continues from (else None) and the run's output folder, both checked."""
    checkpoint = None
    if resume_from is not None:
        checkpoint = read_checkpoint(resume_from)
        changed = plan.mismatches(checkpoint.trainer_state["plan"])
        if changed:
            raise ValueError(
                "resume_from needs the options of the run it continues; these differ: " + "; ".join(changed)
            )
        output_dir = checkpoint.run_dir if output_dir is None else output_dir
        logger.info("resuming from %s (step %d of %d)", checkpoint.path, checkpoint.step, plan.total_steps)
    else:
        if (plan.far is not None or plan.freeze_ffn) and is_reconfigured(model):
            raise ValueError(
                "this model is already reconfigured by FAR; pass the plain model, or config=None to train it as it is"
            )
        if output_dir is not None and has_run(output_dir):
            raise ValueError(
                f"output_dir {str(output_dir)!r} already holds a run's checkpoints; continue it with "
                "resume_from=output_dir (the far command: --resume), or choose another output_dir"
            )
    if plan.checkpoint_every is not None and output_dir is None:
        raise ValueError("checkpoint_every needs an output_dir to write the checkpoints to")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "the model has no trainable parameter (every requires_grad is False); there is nothing to train"
        )
    return checkpoint, output_dir
