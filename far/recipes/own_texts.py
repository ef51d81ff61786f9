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
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from far.data.texts import DEFAULT_HOLDOUT, TextChunks, load_text_chunks
from far.evaluation.perplexity import perplexity
from far.hardware import peak_rss_bytes
from far.llm.gguf_file import load_lean_model, read_config, read_header
from far.llm.lean_far import Layout
from far.llm.lean_saving import save_trained
from far.llm.text_budget import PREFIX_CACHE_MIB, TextMemoryPlan, TrainedShare, plan_text_memory
from far.llm.text_runner import SCORES, TextRunner, TextTraining, cpu_seconds
from far.llm.text_steps import BATCHED_DIRECTIONS, MAX_PRIMING_CHUNKS
from far.llm.tokenizer import load_gguf_tokenizer
from far.models import find_gguf
from far.recipes.configuration import configuration_record
from far.recipes.settings import RunSettings
from far.saving.safetensors_file import DTYPES, LEARNERS_FILE
from far.storage.atomic import write_json
from far.training.distributed import Parallel
from far.training.engine import Cadence, train
from far.training.memory import PhaseMemory, release_freed_memory
from far.training.options import LEARNING_RATES

# Chunks of 256 tokens; MeZO needs many cheap steps, AdamW few (the rates: LEARNING_RATES, which says why). AdamW's
# batch of 4 keeps SmolLM2-135M under 640 MiB (docs/llm.md).
_LR = LEARNING_RATES["causal LM texts"]
# AdamW's default run is one epoch, stopped at this many steps (SmolLM2-135M: about 10 CPU s a step, so about 20
# CPU minutes) so that a large folder does not start hours of work unasked; --epochs or --max-steps set the length.
STEP_BUDGET = 120
TEXT_DEFAULTS = {
    "adamw": dict(
        lr=_LR["adamw"], epochs=1.0, max_steps=None, step_budget=STEP_BUDGET, batch_size=4, max_length=256, warmup=0.0
    ),
    "mezo": dict(lr=_LR["mezo"], epochs=None, max_steps=500, batch_size=8, max_length=256, warmup=0.0),
    # Five forward passes a step (MeZO: two): the steps of about MeZO's 500 in CPU time.
    "zo-batched": dict(lr=_LR["zo-batched"], epochs=None, max_steps=200, batch_size=8, max_length=256, warmup=0.0),
}
# The learners file keeps bf16 values, one byte each as a difference from the stock value (far.llm.lean_learners):
# AdamW's fp32 weights are rounded to them at the end (SmolLM2: 17 MB instead of 67) and scored as rounded.
SHIPPED_DTYPE = torch.bfloat16
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
    return settings.lean_layout(n_layers, dtype)


def _gguf_path(settings: RunSettings) -> Path:
    try:
        return Path(settings.model) if settings.model.endswith(".gguf") else find_gguf(settings.model)
    except ModuleNotFoundError as e:
        raise ValueError(str(e)) from None


def _memory_plan(
    settings: RunSettings, hparams: dict, texts: TextRun, gguf_path: Path, layout: Layout
) -> TextMemoryPlan | None:
    """The plan that fits `texts.memory_budget` (None without a budget); refused here, before the model loads."""
    if texts.memory_budget is None:
        return None
    plan = plan_text_memory(
        texts.memory_budget,
        gguf_path,
        optimizer=settings.optimizer,
        trainable_dtype=settings.trainable_dtype,
        trained=TrainedShare(layout.frozen_layers, layout.far.retention if layout.far is not None else 1.0),
        batch_size=hparams["batch_size"],
        max_length=hparams["max_length"],
    )
    logger.info(
        "memory budget %g MiB: micro-batches of %d chunks, estimate %d MiB",
        plan.budget_mib,
        plan.micro_batch,
        plan.estimate_mib,
    )
    return plan


def _chunks(settings: RunSettings, max_length: int, texts: TextRun, gguf_path: Path, memory: PhaseMemory) -> TextChunks:
    """The texts as chunks of token ids; with --max-train-samples or --max-eval-samples the first chunks of each."""
    tokenizer = load_gguf_tokenizer(gguf_path)
    memory.mark("tokenizer")
    chunks = load_text_chunks(
        texts.train_file, tokenizer, max_length, texts.validation_file, texts.holdout, settings.seed
    )
    del tokenizer  # the texts are tokens now; nothing later reads text
    release_freed_memory()
    if settings.max_train_samples or settings.max_eval_samples:  # the first chunks of each, as for labelled rows
        first = {"train": chunks.train[: settings.max_train_samples]}
        first["validation"] = chunks.validation[: settings.max_eval_samples]
        info = {**chunks.info, "train_chunks": len(first["train"]), "validation_chunks": len(first["validation"])}
        chunks = dataclasses.replace(chunks, **first, info=info)
    return chunks


def _training(
    settings: RunSettings, hparams: dict, n_train: int, layout: Layout, plan: TextMemoryPlan | None
) -> TextTraining:
    """Batches, steps and priming chunks of a run on `n_train` chunks.

    Raises:
        ValueError: FAR's gradient priming would get no chunk.
    """
    batch_size = min(hparams["batch_size"], n_train)
    steps_per_epoch = math.ceil(n_train / batch_size)
    micro = min(plan.micro_batch, batch_size) if plan is not None else batch_size
    # --priming N (a number) primes on N chunks; a fraction of the steps (the default) on MAX_PRIMING_CHUNKS.
    wanted = settings.priming if isinstance(settings.priming, int) else MAX_PRIMING_CHUNKS
    primes = layout.far is not None and layout.far.selection != "random"  # random selection reads no scores
    to_prime = min(wanted, n_train) if primes else 0
    if primes and not to_prime:
        raise ValueError("--priming must give at least one chunk for gradient priming with --method far")
    steps = hparams["max_steps"] or math.ceil(hparams["epochs"] * steps_per_epoch)
    budget = hparams.get("step_budget")
    if budget is not None and steps > budget:
        logger.info(
            "stopping at the default budget of %d steps (%.0f%% of an epoch of %d): --epochs 1 or --max-steps N "
            "trains longer",
            budget,
            100 * budget / steps_per_epoch,
            steps_per_epoch,
        )
        steps = budget
    return TextTraining(
        settings.optimizer,
        hparams["lr"],
        batch_size,
        micro,
        steps,
        steps_per_epoch,
        seed=settings.seed,
        mezo_eps=settings.mezo_eps,
        directions=settings.mezo_directions if settings.mezo_directions != 1 else BATCHED_DIRECTIONS,
        weight_decay=settings.weight_decay,
        eval_batch=min(settings.eval_batch_size, micro),
        priming_chunks=to_prime,
        prefix_cache_mib=PREFIX_CACHE_MIB if plan is None else plan.prefix_cache_mib,
        resume=settings.resume,
        hyperparameters=hparams,
    )


def own_texts_run(
    settings: RunSettings,
    texts: TextRun,
    memory: PhaseMemory | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> dict | None:
    """Fine-tune a GGUF causal LM on `texts`, score held-out perplexity; writes metrics.json, the log and the
    learners file into the run's folder; returns the metrics record (None in a process of a torchrun run other
    than the first, which writes and returns it).

    Args:
        on_step: Called with each step's log record, after its checkpoint (if one is due) is written.

    Raises:
        ValueError: bad settings, texts, budget or output folder: all before the model loads.
    """
    memory = memory or PhaseMemory()
    memory.mark("imports")
    _check(settings)
    hparams = settings.hyperparameters(TEXT_DEFAULTS)
    gguf_path = _gguf_path(settings)
    layout = _layout(settings, read_config(read_header(gguf_path)).num_layers)
    plan = _memory_plan(settings, hparams, texts, gguf_path, layout)
    release_freed_memory()
    chunks = _chunks(settings, hparams["max_length"], texts, gguf_path, memory)
    settings.check_output(texts.name)  # the texts first: a bad file is named before a busy folder
    training = _training(settings, hparams, len(chunks.train), layout, plan)
    total_steps, steps_per_epoch = training.total_steps, training.steps_per_epoch
    memory.mark("data")
    # Under torchrun: every process trains on its share of each batch, the first one writes the run's files; with
    # --distributed fsdp each holds AdamW's state of its own share of the trained tensors (far.llm.owned_adamw).
    parallel = Parallel.from_environment(shard=settings.shards)
    out = parallel.on_main(settings.claim_output, texts.name)
    out.mkdir(parents=True, exist_ok=True)  # each process's scratch file of the frozen bottom's states goes there

    started, cpu_started = time.perf_counter(), cpu_seconds()
    model = load_lean_model(gguf_path)
    release_freed_memory()
    memory.mark("weights")
    runner = TextRunner(model, chunks.train, chunks.validation, layout, training, perplexity, out, memory, parallel)
    cadence = Cadence(
        total_steps,
        eval_every=settings.eval_every,
        epoch_steps=steps_per_epoch,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_last=False,  # the learners file holds the finished run
    )
    main = parallel.is_main
    log_path = out / "log.jsonl" if main else None
    start = train(runner, cadence, log_path, progress=settings.progress and main, on_step=on_step)
    training_seconds = runner.training_seconds()
    memory.mark("training")
    shipped = SHIPPED_DTYPE if settings.save_model and total_steps else None
    final, trained_precision = runner.final_scores(shipped)
    bottom = runner.close_bottom()
    if parallel.active:  # each process's own peak (the first one's is metrics.json's)
        logger.info("process %d of %d: peak RSS %.1f MiB", parallel.rank, parallel.world_size, peak_rss_bytes() / 2**20)
    if not main:  # the first process saves, writes and reports
        parallel.close()
        return None

    files = {"step_log": "log.jsonl"}
    learners_bytes = None
    if settings.save_model and total_steps:
        learners_bytes = save_trained(model, out / LEARNERS_FILE, base=gguf_path, values_dtype=SHIPPED_DTYPE)
        files["learners"] = LEARNERS_FILE
        memory.mark("saving")
    metrics = {k: final[k] for k in SCORES}
    record = {
        "task": "texts",
        "name": texts.name,
        "method": settings.method,
        "optimizer": settings.optimizer,
        "model": settings.model,
        "runtime": "lean",
        "objective": "next-token",
        "metrics": metrics,
        "before": runner.before,
        "perplexity_change": metrics["perplexity"] / runner.before["perplexity"] - 1.0,
        "evals": runner.evals,
        "steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "epochs": total_steps / steps_per_epoch,
        "retention": None if layout.far is None else layout.far.retention,
        "frozen_layers": runner.depth,
        "configuration": configuration_record(settings, runner.depth, layout.far),
        "trainable_parameters": model.num_parameters(trainable_only=True),
        "total_parameters": model.num_parameters(),
        "trainable_dtype": str(layout.dtype).removeprefix("torch."),
        # The learners file's values; `metrics` are the model holding them, `trained_precision_metrics` before.
        "shipped_dtype": str(SHIPPED_DTYPE).removeprefix("torch.") if learners_bytes is not None else None,
        "trained_precision_metrics": trained_precision,
        "gradient_priming_chunks": runner.primed,
        "priming_seconds": runner.priming_seconds,
        "training_seconds": training_seconds,
        "eval_seconds": runner.eval_seconds,
        "total_seconds": time.perf_counter() - started,
        "cpu_seconds": runner.prior_cpu + cpu_seconds() - cpu_started,
        "peak_rss_bytes": peak_rss_bytes(),
        "memory_phases": memory.phases,
        "bottom_states": bottom,
        "memory_plan": None if plan is None else dataclasses.asdict(plan),
        "hyperparameters": _hyperparameters(settings, hparams, training, runner),
        "texts": chunks.info,
        "files": files,
        "learners_file_bytes": learners_bytes,
        "base_model_file": str(gguf_path),
        "resumed_from_step": start.first if start.resumed else None,
    }
    write_json(out / "metrics.json", record)
    parallel.close()
    return record


def _hyperparameters(settings: RunSettings, hparams: dict, training, runner: TextRunner) -> dict:
    """What the run trained with, as metrics.json records it."""
    return {
        **hparams,
        "batch_size": training.batch_size,
        "micro_batch": training.micro_batch,
        "mezo_eps": settings.mezo_eps,
        **({"directions": runner.steps.zeroth_order.directions} if settings.optimizer == "zo-batched" else {}),
        "seed": settings.seed,
        "weight_decay": settings.weight_decay,
    }
