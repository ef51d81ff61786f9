"""A causal LM fine-tuned on a user's own texts with the next-token loss, on the lean runtime.

What `far train --model smollm2-135m --train-file notes/` runs. The texts are packed into chunks
(`far.data.texts`), a part held out; the GGUF model is read into compact storage (`far.llm`), and the
optimizer trains what the method leaves trainable:

- FAR with depth (the default, `--method far`): gradient priming on a few chunks, the bottom two
  thirds of the layers frozen whole and their output kept per chunk, on disk, computed for every
  chunk the run will read before its first step, after which the bottom's weights are freed
  (`far.llm.bottom_on_disk`); 10% of all FFN nodes as learners in the layers above with those
  layers' attention and norms.
- AdamW on those weights (the default optimizer): one forward and one backward pass of the top a step,
  backward stopping at the kept bottom (`far.llm.backprop`); the trained weights in fp32. MeZO
  (`--optimizer mezo`, two forward passes of the top a step, `far.llm.zo`) or the batched one-sided
  estimator (`--optimizer zo-batched`, `far.llm.zo_batched`) on the same weights, stored in bf16.

Held-out perplexity and next-token accuracy are measured before training, at the end of every
epoch (and every `--eval-every` steps) and at the end (`far.evaluation.perplexity`), in metrics.json
and in the step log. `--checkpoint-every N` writes what trains and the optimizer's state every N
steps (`far.llm.lean_checkpoint`); `--resume` goes on from the newest one and ends where the
uninterrupted run would, tensor for tensor. The result is `learners.safetensors`, written by
`far.llm.lean_saving.save_trained` for the stock GGUF model.

    >>> record = own_texts_run(RunSettings(model="smollm2-135m", optimizer="mezo"), TextRun("notes/"))
    >>> record["before"]["perplexity"], record["metrics"]["perplexity"]
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from far.data.texts import DEFAULT_HOLDOUT, load_text_chunks
from far.evaluation.perplexity import perplexity
from far.hardware import peak_rss_bytes
from far.llm.bottom_on_disk import keep_bottom_on_disk
from far.llm.gguf_file import load_lean_model, read_config, read_header
from far.llm.lean_checkpoint import read_lean_checkpoint, restore_trained, save_lean_checkpoint
from far.llm.lean_far import ZO_RETENTION, prime_and_split, set_trainable, zeroth_order_depth
from far.llm.lean_saving import round_trained, save_trained
from far.llm.prefix import PrefixCache
from far.llm.text_budget import PREFIX_CACHE_MIB, TrainedShare, plan_text_memory
from far.llm.text_steps import (
    BATCHED_DIRECTIONS,
    MAX_PRIMING_CHUNKS,
    PRIMING_MICRO_BATCH,
    TextSteps,
    priming_loss,
)
from far.llm.tokenizer import load_gguf_tokenizer
from far.models import find_gguf
from far.recipes.settings import RunSettings
from far.seeds import derive_seed
from far.storage.atomic import write_json
from far.training.log import RunLog, progress_bar
from far.training.memory import PhaseMemory, release_freed_memory

# Chunks of 256 tokens; MeZO needs many cheap steps, AdamW few. The rates are those experiments/own_texts_optimizers.py
# picked on chunks held out of the training split; AdamW's batch of 4 keeps SmolLM2-135M under 640 MiB (docs/llm.md).
TEXT_DEFAULTS = {
    "adamw": dict(lr=3e-4, epochs=1.0, max_steps=None, batch_size=4, max_length=256, warmup=0.0),
    "mezo": dict(lr=1e-4, epochs=None, max_steps=500, batch_size=8, max_length=256, warmup=0.0),
    # Five forward passes a step (MeZO: two): the steps of about MeZO's 500 in CPU time.
    "zo-batched": dict(lr=1e-5, epochs=None, max_steps=200, batch_size=8, max_length=256, warmup=0.0),
}
LEARNERS_FILE = "learners.safetensors"
# The learners file keeps bf16 values, one byte each as a difference from the stock value (far.llm.lean_learners):
# AdamW's fp32 weights are rounded to them at the end (SmolLM2: 17 MB instead of 67) and scored as rounded.
SHIPPED_DTYPE = torch.bfloat16
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextRun:
    """The texts of a run: a folder or file to train on, and one to score on (else `holdout` of the first)."""

    train_file: str
    validation_file: str | None = None
    holdout: float = DEFAULT_HOLDOUT
    memory_budget: float | None = None  # MiB of whole-process peak RSS (far.llm.text_budget)

    @property
    def name(self) -> str:
        """The training folder's or file's name: the run's folder is `runs/<name>-<model>-<method>`."""
        return Path(str(self.train_file).rstrip("/\\")).stem or "texts"


@dataclass(frozen=True)
class Layout:
    """What trains: FAR's config (None: no surgery), the FFN part ("all", "learners", "none"), the frozen bottom."""

    far: object
    ffn: str
    frozen_layers: int
    dtype: torch.dtype


def _check(settings: RunSettings) -> None:
    if settings.optimizer not in TEXT_DEFAULTS:
        raise ValueError(f"a causal LM trains on texts with --optimizer {' or '.join(TEXT_DEFAULTS)}")
    if settings.method_spec.lean_ffn is None:
        raise ValueError(
            f"--method {settings.method} is not available for a GGUF causal LM; use far, full or freeze-ffn"
        )
    unsupported = [
        flag
        for flag, given in (
            ("--bf16", settings.bf16),
            ("--attention-retention", settings.attention_retention is not None),
            ("--prime-frozen", settings.prime_frozen is not None),
            ("--runtime", settings.runtime != "auto"),
            ("--grad-accum", settings.grad_accum != 1),
            ("--mezo-directions", settings.mezo_directions != 1 and settings.optimizer != "zo-batched"),
            ("--warmup", settings.warmup not in (None, 0, 0.0)),
            ("--cache-frozen", settings.cache_frozen),
            ("--group-by-length", settings.group_by_length),
        )
        if given
    ]
    if unsupported:
        raise ValueError(
            f"{', '.join(unsupported)} is not available for a causal LM trained on texts (the lean runtime computes in "
            "fp32, splits FFNs only, keeps the frozen bottom's output itself and steps at a constant rate); drop it"
        )


def _layout(settings: RunSettings, n_layers: int) -> Layout:
    """What trains, decided before loading: FAR with depth by default, as MeZO + FAR on prompts."""
    dtype = DTYPES[settings.trainable_dtype] if settings.optimizer != "adamw" else torch.float32
    far_config = settings.far
    if far_config is None:
        return Layout(None, settings.method_spec.lean_ffn, int(settings.freeze_layers or 0), dtype)
    if far_config.freeze_layers is None:
        far_config = dataclasses.replace(
            far_config,
            freeze_layers=zeroth_order_depth(n_layers),
            retention=ZO_RETENTION if settings.retention is None else far_config.retention,
        )
    depth = far_config.freeze_layers if isinstance(far_config.freeze_layers, int) else 0
    return Layout(far_config, "learners", depth, dtype)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def own_texts_run(
    settings: RunSettings,
    texts: TextRun,
    memory: PhaseMemory | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> dict:
    """Fine-tune a GGUF causal LM on `texts`, score held-out perplexity; writes metrics.json, the log and the
    learners file into the run's folder; returns the metrics record.

    Args:
        on_step: Called with each step's log record, after its checkpoint (if one is due) is written.

    Raises:
        ValueError: bad settings, texts, budget or output folder: all before the model loads.
    """
    memory = memory or PhaseMemory()
    memory.mark("imports")
    _check(settings)
    hparams = settings.hyperparameters(TEXT_DEFAULTS)
    try:
        gguf_path = Path(settings.model) if settings.model.endswith(".gguf") else find_gguf(settings.model)
    except ModuleNotFoundError as e:
        raise ValueError(str(e)) from None
    config = read_config(read_header(gguf_path))
    layout = _layout(settings, config.num_layers)
    cache_mib, plan = PREFIX_CACHE_MIB, None
    if texts.memory_budget is not None:  # refused here, before the model loads, when it cannot fit
        share = TrainedShare(layout.frozen_layers, layout.far.retention if layout.far is not None else 1.0)
        plan = plan_text_memory(
            texts.memory_budget,
            gguf_path,
            optimizer=settings.optimizer,
            trainable_dtype=settings.trainable_dtype,
            trained=share,
            batch_size=hparams["batch_size"],
            max_length=hparams["max_length"],
        )
        cache_mib = plan.prefix_cache_mib
        logger.info(
            "memory budget %g MiB: micro-batches of %d chunks, estimate %d MiB",
            plan.budget_mib,
            plan.micro_batch,
            plan.estimate_mib,
        )
    settings.check_output(texts.name)
    release_freed_memory()

    tokenizer = load_gguf_tokenizer(gguf_path)
    memory.mark("tokenizer")
    chunks = load_text_chunks(
        texts.train_file, tokenizer, hparams["max_length"], texts.validation_file, texts.holdout, settings.seed
    )
    del tokenizer  # the texts are tokens now; nothing later reads text
    release_freed_memory()
    if settings.max_train_samples or settings.max_eval_samples:  # the first chunks of each, as for labelled rows
        train, validation = chunks.train[: settings.max_train_samples], chunks.validation[: settings.max_eval_samples]
        info = {**chunks.info, "train_chunks": len(train), "validation_chunks": len(validation)}
        chunks = dataclasses.replace(chunks, train=train, validation=validation, info=info)
    n_train, batch_size = len(chunks.train), min(hparams["batch_size"], len(chunks.train))
    steps_per_epoch = math.ceil(n_train / batch_size)
    total_steps = hparams["max_steps"] or math.ceil(hparams["epochs"] * steps_per_epoch)
    micro = min(plan.micro_batch, batch_size) if plan is not None else batch_size
    # --priming N (a number) primes on N chunks; a fraction of the steps (the default) on MAX_PRIMING_CHUNKS.
    wanted = settings.priming if isinstance(settings.priming, int) else MAX_PRIMING_CHUNKS
    to_prime = min(wanted, n_train) if layout.far is not None and layout.far.selection != "random" else 0
    if layout.far is not None and layout.far.selection != "random" and not to_prime:
        raise ValueError("--priming must give at least one chunk for gradient priming with --method far")
    memory.mark("data")
    out = settings.claim_output(texts.name)

    started, cpu_started = time.perf_counter(), _cpu_seconds()
    model = load_lean_model(gguf_path)
    release_freed_memory()
    memory.mark("weights")

    @functools.cache
    def order(epoch: int) -> list[int]:
        return torch.randperm(
            n_train, generator=torch.Generator().manual_seed(derive_seed(settings.seed, epoch))
        ).tolist()

    def rows(step: int) -> list[int]:
        epoch, index = divmod(step, steps_per_epoch)
        return order(epoch)[index * batch_size : (index + 1) * batch_size]

    def batch(step: int) -> list[Tensor]:
        ids = chunks.train[rows(step)]
        return [ids[i : i + micro] for i in range(0, len(ids), micro)]

    resume, trainer_state = None, {}
    if settings.resume and (Path(out) / "checkpoints").is_dir():
        resume, trainer_state = read_lean_checkpoint(out)
    priming_started, primed = time.perf_counter(), 0
    if resume is not None:
        if trainer_state["hyperparameters"] != hparams:
            raise ValueError(
                f"--resume continues {out} with its own hyper-parameters {trainer_state['hyperparameters']}; these are "
                f"{hparams}: give the same options"
            )
        optimizer_state = restore_trained(model, resume, trainer_state, layout.dtype)
        logger.info("resuming from %s (step %d of %d)", resume, trainer_state["step"], total_steps)
    elif layout.far is not None:
        primed = to_prime
        ids = chunks.train[order(0)[:primed]]
        micro_batches = [ids[i : i + PRIMING_MICRO_BATCH] for i in range(0, primed, PRIMING_MICRO_BATCH)]
        prime_and_split(model, micro_batches, priming_loss(layout.frozen_layers), layout.far, layout.dtype)
    else:
        set_trainable(model, layout.ffn, layout.dtype, frozen_layers=layout.frozen_layers)
    priming_seconds = time.perf_counter() - priming_started
    depth = model.lowest_trainable_layer()
    first = int(trainer_state["step"]) if resume is not None else 0
    train_cache = eval_cache = None
    if depth:
        read = sorted({row for step in range(first, total_steps) for row in rows(step)})
        train_cache = eval_cache = keep_bottom_on_disk(model, depth, [chunks.train[read], chunks.validation], out)
    if depth and train_cache is None:  # no room on disk: in memory, as many as fit
        train_cache = PrefixCache(model, max_bytes=int(cache_mib * 2 / 3 * 2**20))
        eval_cache = PrefixCache(model, max_bytes=int(cache_mib / 3 * 2**20))
    steps = TextSteps(
        model,
        settings.optimizer,
        hparams["lr"],
        train_cache,
        eps=settings.mezo_eps,
        directions=settings.mezo_directions if settings.mezo_directions != 1 else BATCHED_DIRECTIONS,
        seed=settings.seed,
        weight_decay=settings.weight_decay,
    )
    release_freed_memory()
    memory.mark("priming" if layout.far is not None else "trainable")

    eval_batch = min(settings.eval_batch_size, micro)
    eval_seconds = 0.0

    def evaluate() -> dict:
        nonlocal eval_seconds
        t = time.perf_counter()
        scores = perplexity(model, chunks.validation, eval_batch, eval_cache)
        eval_seconds += time.perf_counter() - t
        return scores

    if resume is not None:
        steps.load(optimizer_state)
        before, evals = trainer_state["before"], trainer_state["evals"]
        prior_seconds, prior_cpu = trainer_state["seconds"], trainer_state["cpu_seconds"]
    else:
        before, evals, prior_seconds, prior_cpu = evaluate(), [], 0.0, 0.0
        logger.info("held-out perplexity before training: %.3f", before["perplexity"])
    memory.mark("evaluation before")
    train_started, train_cpu_started = time.perf_counter(), _cpu_seconds()
    log = RunLog(out / "log.jsonl", resume_step=first if resume is not None else None)
    if resume is None:
        log.write({"step": 0, "epoch": 0.0, "eval": before})
    try:
        with progress_bar(total_steps, first, settings.progress) as bar:
            for step in range(first, total_steps):
                loss = steps(batch(step))
                done = step + 1
                record = {"step": done, "epoch": round(done / steps_per_epoch, 4), "loss": loss, "lr": hparams["lr"]}
                if (
                    done % steps_per_epoch == 0
                    or done == total_steps
                    or (settings.eval_every and done % settings.eval_every == 0)
                ):
                    record["eval"] = evaluate()
                    evals.append({"step": done, "epoch": record["epoch"], **record["eval"]})
                seconds = prior_seconds + time.perf_counter() - train_started
                cpu = prior_cpu + _cpu_seconds() - train_cpu_started
                record.update(elapsed=round(seconds, 3), cpu_seconds=round(cpu, 3), peak_rss_bytes=peak_rss_bytes())
                log.write(record)
                if settings.checkpoint_every and done % settings.checkpoint_every == 0 and done < total_steps:
                    state = {"ffn": layout.ffn, "frozen_layers": depth, "hyperparameters": hparams}
                    state.update(before=before, evals=evals)
                    save_lean_checkpoint(
                        out, done, model, steps.state(), {**state, "seconds": seconds, "cpu_seconds": cpu}
                    )
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.4g}", **({"ppl": f"{record['eval']['perplexity']:.4g}"} if "eval" in record else {})
                )
                if on_step is not None:
                    on_step(record)
    finally:
        log.close()
    training_seconds = prior_seconds + time.perf_counter() - train_started
    memory.mark("training")
    final = evals[-1] if evals and evals[-1]["step"] == total_steps else {"step": total_steps, **evaluate()}
    trained_precision = None
    if settings.save_model and total_steps and layout.dtype != SHIPPED_DTYPE:
        # What ships is what is scored: the fp32 weights rounded as the file keeps them, then evaluated again.
        trained_precision = {k: final[k] for k in ("perplexity", "token_accuracy", "loss")}
        round_trained(model, SHIPPED_DTYPE)
        final = {"step": total_steps, **evaluate()}
    bottom = None
    if eval_cache is not None:
        on_disk = eval_cache.store is not None
        bottom = {"layers": depth, "kept": "disk" if on_disk else "memory", "released": model.released_layers}
        bottom["bytes"] = eval_cache.store.bytes if on_disk else eval_cache.bytes
        if on_disk:
            eval_cache.store.close()  # its disk back now (the process's end would give it back too)

    files = {"step_log": "log.jsonl"}
    learners_bytes = None
    if settings.save_model and total_steps:
        learners_bytes = save_trained(model, out / LEARNERS_FILE, base=gguf_path, values_dtype=SHIPPED_DTYPE)
        files["learners"] = LEARNERS_FILE
        memory.mark("saving")
    metrics = {k: final[k] for k in ("perplexity", "token_accuracy", "loss")}
    record = {
        "task": "texts",
        "name": texts.name,
        "method": settings.method,
        "optimizer": settings.optimizer,
        "model": settings.model,
        "runtime": "lean",
        "objective": "next-token",
        "metrics": metrics,
        "before": before,
        "perplexity_change": metrics["perplexity"] / before["perplexity"] - 1.0,
        "evals": evals,
        "steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "epochs": total_steps / steps_per_epoch,
        "retention": None if layout.far is None else layout.far.retention,
        "frozen_layers": depth,
        "trainable_parameters": model.num_parameters(trainable_only=True),
        "total_parameters": model.num_parameters(),
        "trainable_dtype": str(layout.dtype).removeprefix("torch."),
        # The learners file's values; `metrics` are the model holding them, `trained_precision_metrics` before.
        "shipped_dtype": str(SHIPPED_DTYPE).removeprefix("torch.") if learners_bytes is not None else None,
        "trained_precision_metrics": trained_precision,
        "gradient_priming_chunks": primed,
        "priming_seconds": priming_seconds,
        "training_seconds": training_seconds,
        "eval_seconds": eval_seconds,
        "total_seconds": time.perf_counter() - started,
        "cpu_seconds": prior_cpu + _cpu_seconds() - cpu_started,
        "peak_rss_bytes": peak_rss_bytes(),
        "memory_phases": memory.phases,
        "bottom_states": bottom,
        "memory_plan": None if plan is None else dataclasses.asdict(plan),
        "hyperparameters": {
            **hparams,
            "batch_size": batch_size,
            "micro_batch": micro,
            "mezo_eps": settings.mezo_eps,
            **({"directions": steps.zeroth_order.directions} if settings.optimizer == "zo-batched" else {}),
            "seed": settings.seed,
            "weight_decay": settings.weight_decay,
        },
        "texts": chunks.info,
        "files": files,
        "learners_file_bytes": learners_bytes,
        "base_model_file": str(gguf_path),
        "resumed_from_step": first if resume is not None else None,
    }
    write_json(out / "metrics.json", record)
    return record
