"""`export_executorch`: a FAR-reconfigured model as an ExecuTorch export folder, ready to train on a device.

    >>> far.device.export_executorch(model, tokenizer, "OUT", batch_size=32, max_length=64, optimizer="adamw", lr=1e-4)
    >>> far.device.write_examples("train.csv", tokenizer, "OUT", "OUT/train.safetensors")
    >>> far.device.train("OUT", "OUT/train.safetensors", epochs=3)
    >>> far.device.to_learners("OUT", "OUT/state.safetensors", stock_model, "user.safetensors")

The folder's layout is in `far.device.manifest` and docs/device.md.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from far.device.lowering import lower_views, xnnpack_level
from far.device.manifest import (
    CLASSIFICATION,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PROGRAM_FILES,
    STATE,
    TOKENIZER,
    sha256_file,
    tensor_spec,
    write_json_into,
)
from far.device.optim import optimizer_settings
from far.device.plan import ExportPlan, plan_export
from far.device.program import build_views, example_inputs, trainable_tensors
from far.device.state import DeviceState, trainable_sha256, write_state
from far.storage.atomic import atomic_dir
from far.training.options import check_int

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    """What `export_executorch` wrote: the folder, each file's size in bytes, and the seconds each stage took."""

    out_dir: Path
    sizes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def micro_batch(batch_size: object, micro_batch_size: object) -> int:
    """The programs' fixed batch: `micro_batch_size` (dividing `batch_size`), or `batch_size` itself."""
    batch_size = check_int("batch_size", batch_size, 1)
    if micro_batch_size is None:
        return batch_size
    if batch_size % check_int("micro_batch_size", micro_batch_size, 1):
        raise ValueError(
            f"micro_batch_size={micro_batch_size} must divide batch_size={batch_size} (each step averages the "
            "gradients of batch_size / micro_batch_size equal micro-batches)"
        )
    return int(micro_batch_size)


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an output path that is a file, or a folder holding files (unless overwrite), before anything is built."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} is a file; name a folder to write the export into")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        what = "an earlier export (its training state too)" if (out_dir / MANIFEST).is_file() else "other files"
        raise ValueError(f"{str(out_dir)!r} already holds {what}; name a new folder, or pass overwrite=True")


def _tokenizer_json(tokenizer) -> tuple[str, str, int]:
    """(tokenizer.json text, pad token, pad id) of a fast Hugging Face tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise ValueError(
            f"the export writes the tokenizer as tokenizer.json, which needs a fast (Rust) tokenizer; got "
            f"{type(tokenizer).__name__}: load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    if tokenizer.pad_token is None:
        raise ValueError("the tokenizer has no padding token; the programs take examples padded to max_length")
    return backend.to_str(pretty=True), str(tokenizer.pad_token), int(tokenizer.pad_token_id)


def _manifest(
    plan: ExportPlan, model: nn.Module, batch_size: int, micro: int, max_length: int, optimizer: dict
) -> dict:
    """The manifest's fields from the model and the settings (the programs' are added as they are written)."""
    config = getattr(model, "config", None)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "objective": CLASSIFICATION,
        "model_type": plan.model_type,
        "task": {
            "kind": "regression" if plan.regression else "classification",
            "labels": list(plan.labels),
            "num_labels": plan.num_labels,
        },
        "batch_size": batch_size,
        "micro_batch_size": micro,
        "accumulate": batch_size // micro,
        "max_length": max_length,
        "hidden_size": plan.hidden_size,
        "vocab_size": plan.vocab_size,
        "num_layers": len(plan.layers),
        "frozen_layers": plan.frozen_layers,
        "bottom": plan.bottom,
        "far_config": plan.config.to_dict(),
        "ffns": {name: list(ffn.inputs) for name, ffn in plan.ffns.items()},
        "learners": {name: [int(i) for i in idx] for name, idx in plan.learners.items()},
        "base_fingerprint": plan.base_fingerprint,
        "head": plan.head,
        "model_config": config.to_diff_dict() if hasattr(config, "to_diff_dict") else {},
        "optimizer": optimizer,
    }


def _inputs(plan: ExportPlan, batch_size: int, max_length: int) -> tuple[list[dict], list[dict] | None]:
    ids = ("input_ids", "attention_mask", "token_type_ids")
    tokens = [tensor_spec(name, (batch_size, max_length), "int64") for name in ids]
    labels = tensor_spec("labels", (batch_size,), "float32" if plan.regression else "int64")
    if not plan.bottom:
        return [*tokens, labels], None
    hidden = tensor_spec("hidden", (batch_size, max_length, plan.hidden_size), "float32")
    return [hidden, tokens[1], labels], tokens


def write_programs(tmp: Path, manifest: dict, programs: Mapping[str, tuple]) -> None:
    """Write each lowered program into the folder and record it in `manifest["programs"]`;
    `programs` is `{role: (lowered program, XNNPACK level, input specs, output names)}`.
    """
    manifest["programs"] = {}
    for role, (lowered, delegated, inputs, outputs) in programs.items():
        file = PROGRAM_FILES[role]
        (tmp / file).write_bytes(lowered.buffer)
        manifest["programs"][role] = {
            "file": file,
            "sha256": sha256_file(tmp / file),
            "xnnpack": delegated,
            "inputs": inputs,
            "outputs": outputs,
            # the memory the runtime plans for the method's activations: what grows with the batch
            "planned_bytes": sum(lowered.executorch_program.execution_plan[0].non_const_buffer_sizes),
        }


def write_folder(
    out_dir: Path,
    manifest: dict,
    programs: Mapping[str, tuple],
    write_tokenizer: Callable[[Path], None],
    tokenizer_fields: dict,
    initial: Mapping,
    seconds: dict[str, float],
    write_extra: Callable[[Path], None] | None = None,
) -> ExportResult:
    """The export folder, atomically: the programs, the tokenizer, what `write_extra(folder)` adds (recording it in
    the manifest), the step-0 state (`initial`, the trainable tensors in the program's order), then the manifest."""
    start = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        write_programs(tmp, manifest, programs)
        write_tokenizer(tmp / TOKENIZER)
        manifest["tokenizer"] = {"file": TOKENIZER, "sha256": sha256_file(tmp / TOKENIZER), **tokenizer_fields}
        if write_extra is not None:
            write_extra(tmp)
        manifest["state"] = {"file": STATE, "initial_sha256": trainable_sha256(initial)}
        write_state(tmp / STATE, DeviceState(tensors=dict(initial)), manifest)
        write_json_into(tmp, MANIFEST, manifest)
    seconds["write"] = time.perf_counter() - start
    sizes = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    return ExportResult(out_dir, sizes, seconds)


def export_executorch(
    model: nn.Module,
    tokenizer,
    out_dir: str | os.PathLike,
    *,
    batch_size: int,
    max_length: int,
    lr: float,
    momentum: float = 0.9,
    optimizer: str = "sgd",
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    schedule: Mapping | None = None,
    micro_batch_size: int | None = None,
    xnnpack: bool | str = False,
    bottom_xnnpack: bool = True,
    overwrite: bool = False,
) -> ExportResult:
    """Write a FAR-reconfigured model as ExecuTorch programs that train its learners, atomically.

    The folder holds train.pte (forward and backward over the trained layers and the head, with
    the optimizer's settings recorded beside it), bottom.pte (the frozen embeddings and bottom layers, forward
    only, when everything below the first trained layer is frozen), tokenizer.json, manifest.json
    and state.safetensors (the trainable tensors at step 0). Everything is checked before anything
    is built, and the folder appears whole or not at all. The programs train without dropout.

    Args:
        model: A BERT sequence classifier reconfigured by FAR (as `far.finetune` or `far train`
            leave it), or a stock one with a learners file applied (`far.load_learners`). It is
            not changed.
        tokenizer: Its fast Hugging Face tokenizer.
        out_dir: The folder to write.
        batch_size, max_length: Examples per optimizer step, and their fixed length in tokens.
        lr, momentum, optimizer, weight_decay, max_grad_norm: The device's optimizer: "sgd"
            (torch.optim.SGD's update with `momentum`, no dampening) or "adamw" (torch.optim.AdamW's,
            default betas and eps), weight decay, and clipping of the gradients' total norm (None:
            none). `far.device.optim` has the updates.
        schedule: None for a constant lr, or linear warmup then decay to zero as
            `{"warmup_steps": w, "total_steps": T or None, "offset": s}` (far's own schedule, evaluated
            at `s` + the device's step: a device run can finish a host run's schedule).
        micro_batch_size: The programs' fixed batch, dividing `batch_size`: each step averages the
            gradients of `batch_size / micro_batch_size` micro-batches, the same update in less
            memory (the program's planned memory grows with its batch). Default `batch_size`.
        xnnpack: Delegate the training program's operators to XNNPACK, one by one: True or "all"
            (every operator it takes: the fastest step, minutes to lower a 6-layer model), "matmul"
            (the matrix products only, a minute: on far_train, about the plain step in more memory),
            False or "none" (the default here and `far export --executorch`'s: seconds).
        bottom_xnnpack: Delegate the bottom program to XNNPACK (seconds to lower).
        overwrite: Replace a folder that holds files already (an earlier export and its state too).

    Returns:
        An `ExportResult`: the folder, the files' sizes and the stages' seconds.

    Raises:
        ValueError: what cannot be exported, and why (architecture, a model FAR did not reconfigure,
            split attention heads, a length beyond the model's positions, a slow tokenizer, ...);
            nothing has been written.
    """
    out_dir = Path(out_dir)
    micro = micro_batch(batch_size, micro_batch_size)
    schedule = dict(schedule or {})
    unknown = set(schedule) - {"warmup_steps", "total_steps", "offset"}
    if unknown:
        raise ValueError(f"schedule takes warmup_steps, total_steps and offset, not {sorted(unknown)}")
    settings = optimizer_settings(
        optimizer,
        lr,
        momentum=momentum,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        warmup_steps=schedule.get("warmup_steps", 0),
        total_steps=schedule.get("total_steps"),
        schedule_offset=schedule.get("offset", 0),
        linear_schedule=bool(schedule),
    )
    level = xnnpack_level(xnnpack)
    check_out_dir(out_dir, overwrite)
    plan = plan_export(model, max_length)
    tokenizer_text, pad_token, pad_id = _tokenizer_json(tokenizer)
    bottom, top = build_views(model, plan)
    train_inputs, bottom_inputs = example_inputs(plan, micro, max_length)
    if level != "none":
        logger.info("lowering the training program to XNNPACK (%s operators, one by one): minutes", level)
    program, order, bottom_program, seconds = lower_views(
        top, train_inputs, bottom, bottom_inputs, xnnpack=level, bottom_xnnpack=bottom_xnnpack
    )
    logger.info("lowered the programs in %s", ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    values = trainable_tensors(top)
    manifest = _manifest(plan, model, batch_size, micro, max_length, settings)
    manifest["trainable"] = [tensor_spec(n, values[n].shape, "float32") for n in order]
    train_specs, bottom_specs = _inputs(plan, micro, max_length)
    programs = {"train": (program, level, train_specs, ["loss", "logits"])}
    if bottom_program is not None:
        programs["bottom"] = (bottom_program, "all" if bottom_xnnpack else "none", bottom_specs, ["hidden"])
    return write_folder(
        out_dir,
        manifest,
        programs,
        lambda path: path.write_text(tokenizer_text, encoding="utf-8"),
        {"pad_token": pad_token, "pad_token_id": pad_id, "padding": "right, to max_length"},
        {n: values[n] for n in order},
        seconds,
    )
