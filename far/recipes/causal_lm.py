"""GLUE by prompts on the lean runtime (`far.llm`): a GGUF causal LM fine-tuned in a few hundred MB.

What `far glue --task sst2 --model smollm2-135m` runs. The whole process stays small because it
imports neither transformers' model code nor `datasets` (the GLUE TSV is read with `csv`, the
tokenizer is `tokenizers` on a cached `tokenizer.json`), reads the GGUF file tensor by tensor into
bf16 (the token embedding stays Q8_0), tokenises each batch as it is drawn, computes only the label
words' logits at the last token, and runs MeZO without writing its perturbation into the weights
(`far.llm.zo`). Evaluation runs in chunks of the training batch size, so it needs no more memory
than a training step. `memory_phases` in metrics.json records the resident memory after each
phase (imports, tokenizer, data, weights, priming, training, evaluation).

A training run also writes `trained.safetensors`: the trained weights only (learners and the
weights outside the FFNs, as stored), to apply to the same GGUF model with
`load_lean_lm(name, trained=path)` (`far.llm.lean_saving`); `--no-save-model` skips it.

Methods: "full" (plain MeZO: every weight but the embedding and its tied head), "far" (gradient
priming, then the learners and everything outside the FFNs) and "freeze-ffn"; optimizer "mezo".
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from far.data.glue import GLUE_TASKS
from far.data.locate import resolve_data_dir
from far.data.prompts import (
    SST2_TEMPLATE,
    PromptBatches,
    PromptTemplate,
    label_word_ids,
    predict_labels,
    prompt_loss_fn,
    read_labelled_tsv,
)
from far.hardware import peak_rss_bytes
from far.llm.gguf_file import load_lean_model
from far.llm.lean_saving import save_trained
from far.llm.prompt_runner import PRIMING_MICRO_BATCH, PromptRunner, PromptTraining
from far.llm.tokenizer import load_gguf_tokenizer
from far.methods import METHODS
from far.models import find_gguf
from far.recipes.configuration import configuration_record
from far.recipes.settings import PROMPT_DEFAULTS, RunSettings
from far.saving.safetensors_file import DTYPES
from far.storage.atomic import atomic_file, write_json
from far.training import engine
from far.training.memory import PhaseMemory, release_freed_memory

PROMPT_TEMPLATES: dict[str, PromptTemplate] = {"sst2": SST2_TEMPLATE}
MAX_PRIMING_BATCHES = 16
TRAINED_FILE = "trained.safetensors"  # `load_lean_lm(model, trained=...)` applies it to the base model
# PRIMING_MICRO_BATCH is the prompt runner's; experiments read it from this recipe too.
__all__ = ["PRIMING_MICRO_BATCH", "PROMPT_TEMPLATES", "TRAINED_FILE", "lean_prompted_run", "priming_batches"]


def _write_predictions(path: Path, predictions: list[int], labels: list[int], names: Sequence[str]) -> None:
    with atomic_file(path) as tmp:
        rows = ["index\tprediction\tlabel"] + [
            f"{i}\t{names[p]}\t{names[y]}" for i, (p, y) in enumerate(zip(predictions, labels, strict=True))
        ]
        tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")


def priming_batches(priming: float | int, max_steps: int) -> int:
    """Gradient-priming batches for a priming length: a number as given, a fraction of the steps capped at 16."""
    if isinstance(priming, int):
        return priming
    return min(MAX_PRIMING_BATCHES, math.ceil(priming * max_steps)) if priming > 0 else 0


def _check(settings: RunSettings, task_name: str) -> PromptTemplate:
    """The task's prompt; refuses what the lean runtime cannot do by prompts."""
    template = PROMPT_TEMPLATES.get(task_name)
    if template is None:
        raise ValueError(
            f"--model {settings.model} is a causal LM, trained by prompts; there is a prompt for "
            f"{', '.join(PROMPT_TEMPLATES)} only, not {task_name}. Use an encoder model for {task_name}"
        )
    if settings.optimizer != "mezo":
        raise ValueError("a GGUF causal LM trains with --optimizer mezo (the lean runtime keeps no gradients)")
    if settings.method_spec.lean_ffn is None:
        runnable = ", ".join(name for name, method in METHODS.items() if method.lean_ffn is not None)
        raise ValueError(f"--method {settings.method} is not available for a GGUF causal LM; use one of {runnable}")
    if settings.bf16:
        raise ValueError("--bf16 is autocast; a GGUF causal LM already stores bf16 and computes in fp32 (drop --bf16)")
    unsupported = [
        flag
        for flag, given in (
            ("--checkpoint-every", settings.checkpoint_every is not None),
            ("--resume", settings.resume),
            ("--prime-frozen", settings.prime_frozen is not None),
            ("--runtime", settings.runtime != "auto"),
            ("--group-by-length", settings.group_by_length),  # the prompt runs draw their own batches (below)
        )
        if given
    ]
    if unsupported:
        raise ValueError(
            f"{', '.join(unsupported)} is not available for a GGUF causal LM on the lean runtime (its runs are short "
            "MeZO runs that keep no optimizer state); drop it, or use an encoder model"
        )
    if settings.attention_retention is not None:
        raise ValueError(
            "--attention-retention is not available for a GGUF causal LM: the lean runtime splits FFNs only "
            "(drop --attention-retention)"
        )
    return template


def _prompt_sets(
    settings: RunSettings, template: PromptTemplate, root: Path, gguf_path: Path, max_length: int, memory: PhaseMemory
) -> tuple[Tensor, PromptBatches, PromptBatches]:
    """The label words' token ids and the training and dev prompts (the first --max-*-samples rows of each)."""
    tokenizer = load_gguf_tokenizer(gguf_path)
    label_ids = label_word_ids(tokenizer, template)
    memory.mark("tokenizer")
    train_texts, train_labels = read_labelled_tsv(root / "train.tsv")
    dev_texts, dev_labels = read_labelled_tsv(root / "dev.tsv")
    n_train = min(len(train_texts), settings.max_train_samples or len(train_texts))
    n_dev = min(len(dev_texts), settings.max_eval_samples or len(dev_texts))
    train_set = PromptBatches(tokenizer, template, train_texts[:n_train], train_labels[:n_train], max_length)
    dev_set = PromptBatches(tokenizer, template, dev_texts[:n_dev], dev_labels[:n_dev], max_length)
    del train_texts, train_labels, dev_texts, dev_labels
    memory.mark("data")
    return label_ids, train_set, dev_set


def lean_prompted_run(
    settings: RunSettings, task_name: str, memory: PhaseMemory | None = None, *, train: bool = True
) -> dict:
    """Fine-tune and evaluate a GGUF causal LM on a GLUE task by prompts; writes metrics.json; returns it.

    With `train=False` the pretrained model is only evaluated (zero-shot inference, nothing trainable).

    Raises:
        ValueError: a task without a prompt, an optimizer or method the lean runtime has not.
    """
    memory = memory or PhaseMemory()
    memory.mark("imports")
    template = _check(settings, task_name)
    hparams = settings.hyperparameters(PROMPT_DEFAULTS)
    steps = (hparams["max_steps"] or 1) if train else 0
    far_config = settings.far if train else None
    primes = far_config is not None and far_config.selection != "random"
    n_priming = priming_batches(settings.priming, steps) if primes else 0
    if primes and not n_priming:
        raise ValueError("--priming must give at least one gradient-priming batch for --method far")
    folder, names = GLUE_TASKS[task_name].folder, GLUE_TASKS[task_name].label_names
    root = resolve_data_dir(settings.data_dir) / "glue" / folder
    try:
        gguf_path = find_gguf(settings.model) if not settings.model.endswith(".gguf") else Path(settings.model)
    except ModuleNotFoundError as e:
        raise ValueError(str(e)) from None
    settings.check_output(task_name)
    release_freed_memory()

    label_ids, train_set, dev_set = _prompt_sets(settings, template, root, gguf_path, hparams["max_length"], memory)
    n_train, n_dev = len(train_set), len(dev_set)

    started = time.perf_counter()
    model = load_lean_model(gguf_path)
    release_freed_memory()
    memory.mark("weights")
    # What trains: FAR with MeZO + FAR's depth by default, or without FAR's surgery plain freezing (--freeze-layers K)
    layout = settings.lean_layout(len(model.layers), DTYPES[settings.trainable_dtype]) if train else None
    training = PromptTraining(
        steps,
        hparams["batch_size"],
        hparams["lr"],
        settings.mezo_eps,
        settings.seed,
        settings.weight_decay,
        priming_batches=n_priming,
    )
    loss_fn = prompt_loss_fn(label_ids)
    runner = PromptRunner(model, train_set.batch, n_train, loss_fn, label_ids, layout, training, memory)
    # The log lines are kept and written with the other files once the run's folder is claimed, after scoring.
    log: list[dict] = []
    engine.train(runner, engine.Cadence(steps, evaluate=False), None, progress=False, on_step=log.append)
    training_seconds = runner.training_seconds()
    memory.mark("mezo_steps")

    eval_started = time.perf_counter()
    predictions = predict_labels(model, dev_set, label_ids, min(settings.eval_batch_size, hparams["batch_size"]))
    eval_seconds = time.perf_counter() - eval_started
    accuracy = sum(p == y for p, y in zip(predictions, dev_set.labels, strict=True)) / len(dev_set)
    memory.mark("evaluation")

    out = settings.claim_output(task_name)
    _write_predictions(out / "predictions.tsv", predictions, dev_set.labels, names)
    with atomic_file(out / "log.jsonl") as tmp:  # whole or not at all, as every file of the run
        tmp.write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")
    files = {"predictions": "predictions.tsv", "step_log": "log.jsonl"}
    trained_bytes = None
    if steps and settings.save_model:  # only what training changed; the GGUF file holds the rest
        trained_bytes = save_trained(model, out / TRAINED_FILE, base=gguf_path)
        files["trained"] = TRAINED_FILE
        memory.mark("saving")
    record = {
        "task": task_name,
        "method": settings.method if train else "zero-shot",
        "retention": None if layout is None or layout.far is None else layout.far.retention,
        "selection": None if layout is None or layout.far is None else layout.far.selection,
        "optimizer": settings.optimizer,
        "model": settings.model,
        "runtime": "lean",
        "metrics": {"accuracy": accuracy},
        "steps": steps,
        "priming_steps": 0,
        "priming_seconds": runner.priming_seconds,
        "training_seconds": training_seconds,
        "eval_seconds": eval_seconds,
        "total_seconds": time.perf_counter() - started,
        "median_step_seconds": statistics.median(runner.step_seconds) if runner.step_seconds else None,
        "peak_rss_bytes": peak_rss_bytes(),
        "trainable_parameters": model.num_parameters(trainable_only=True),
        "frozen_layers": model.lowest_trainable_layer(),
        "configuration": configuration_record(settings, model.lowest_trainable_layer(), far_config),
        "total_parameters": model.num_parameters(),
        "trainable_dtype": settings.trainable_dtype,
        "final_loss": log[-1]["loss"] if log else None,
        "hyperparameters": {**hparams, "mezo_eps": settings.mezo_eps, "seed": settings.seed},
        "freeze_embeddings": True,
        "gradient_priming_examples": runner.primed,
        "prompt": template.template,
        "label_words": list(template.label_words),
        "train_examples": n_train,
        "eval_examples": n_dev,
        "memory_phases": memory.phases,
        "files": files,
        "trained_file_bytes": trained_bytes,
        "base_model_file": str(gguf_path),
    }
    write_json(out / "metrics.json", record)
    return record
