"""`train`: the learners of an export folder trained through ExecuTorch's Python bindings.

Each step runs, for each of the export's `accumulate` micro-batches, the bottom program (if any)
and the training program's forward and backward, averages their gradients, then updates the
program's own trainable tensors with the manifest's optimizer (`far.device.optim`: SGD with
momentum or AdamW, clipping, schedule). The runtime's own SGD (`get_sgd_optimizer`) keeps its
momentum where it cannot be saved, so the update is done here, with the optimizer's state in the
state file. Batches follow `far.device.order`; a state file (`far.device.state`) is written every
`checkpoint_every` steps and at the end, atomically, and `resume=True` goes on from one: a run
killed at any moment and resumed ends with the same state as one never interrupted.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from far.device.examples import read_examples
from far.device.manifest import STATE, DeviceFileError, read_manifest
from far.device.optim import lr_at, update
from far.device.order import epoch_order
from far.device.runtime import DevicePrograms
from far.device.state import DeviceState, read_state, trainable_sha256, write_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """What a `train` call did: the state file written, the steps it took and their losses."""

    state_path: Path
    step: int  # optimizer steps taken in all, this call's included
    losses: list[float] = field(default_factory=list)  # this call's, one per step
    seconds: float = 0.0


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def _start(manifest: Mapping, state_path: Path, resume: bool, seed: int | None, examples_sha: str) -> DeviceState:
    """The state training starts from, checked: the export's initial one, or `state_path`'s with `resume`."""
    if not resume:
        if state_path.is_file():
            try:
                step = read_state(state_path, manifest).step
            except DeviceFileError:  # another export's or a damaged file: nothing of this run to keep
                step = 0
            if step:
                raise ValueError(
                    f"{str(state_path)!r} holds this export's training state at step {step}; pass resume=True to go "
                    "on from it, or another state_path to start over"
                )
        return DeviceState(tensors={}, order_seed=_check_count("seed", 0 if seed is None else seed, 0))
    state = read_state(state_path, manifest)
    if seed is not None and seed != state.order_seed:
        raise ValueError(f"seed={seed} differs from the resumed run's order seed {state.order_seed}; leave seed unset")
    if state.step and state.examples_sha256 != examples_sha:
        raise DeviceFileError(
            f"{str(state_path)!r} was trained on another examples file; resume with the same examples"
        )
    return state


def train(
    out_dir: str | os.PathLike,
    examples: str | os.PathLike,
    *,
    epochs: int = 1,
    state_path: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    seed: int | None = None,
    max_steps: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train an export folder's learners on `examples` for `epochs`, in ExecuTorch, and save the state.

    Args:
        out_dir: The export folder (`export_executorch`).
        examples: An examples file written for it (`write_examples`); at least one batch of them.
        epochs: Train until this many epochs are done (counting those of a resumed run).
        state_path: The state file to write (and, with `resume`, to start from); default
            OUT/state.safetensors. Without `resume`, a file there that holds this export's state
            past step 0 is refused, not overwritten.
        checkpoint_every: Also write the state every this many steps (0: only at the end).
        resume: Start from `state_path` (checked against this export and these examples) instead
            of the export's initial values.
        seed: The batch order's seed (default 0; a resumed run keeps its own).
        max_steps: Stop after this many optimizer steps in all, if fewer than `epochs` make (a
            device run that finishes a host run's schedule).
        on_step: Called as `on_step(step, loss)` after each step (and its checkpoint, if any).

    Returns:
        A `TrainResult`.

    Raises:
        DeviceFileError: a program, examples or state file that is damaged or belongs to another
            export, base model or examples file; nothing has been written then.
        ValueError: too few examples for one batch, or a trained state at `state_path` without `resume`.

    Example:
        >>> far.device.train("OUT", "OUT/train.safetensors", epochs=3, checkpoint_every=50)
    """
    out_dir = Path(out_dir)
    state_path = out_dir / STATE if state_path is None else Path(state_path)
    _check_count("epochs", epochs, 0)
    _check_count("checkpoint_every", checkpoint_every, 0)
    manifest = read_manifest(out_dir)
    data, examples_sha = read_examples(examples, manifest)
    state = _start(manifest, state_path, resume, seed, examples_sha)
    n, micro, accumulate = data["labels"].shape[0], int(manifest["micro_batch_size"]), int(manifest["accumulate"])
    size = micro * accumulate  # examples per optimizer step
    per_epoch = n // size
    if per_epoch == 0:
        raise ValueError(
            f"{n} examples make no batch of {size} ({accumulate} micro-batch(es) of the programs' fixed {micro}); "
            "give more examples"
        )
    total = epochs * per_epoch
    if max_steps is not None:
        total = min(total, _check_count("max_steps", max_steps, 1))
    if state.step >= total:
        logger.info("the state is at step %d (epoch %d): %d step(s) are done already", state.step, state.epoch, total)
        return TrainResult(state_path, state.step)
    settings = manifest["optimizer"]
    programs = DevicePrograms(out_dir, manifest)
    # The program starts at the export's values; a state elsewhere is copied in after a first call.
    pending = bool(state.tensors) and trainable_sha256(state.tensors) != manifest["state"]["initial_sha256"]
    slots = {slot: {name: t.clone() for name, t in values.items()} for slot, values in state.slots.items()}
    step, losses, order, order_epoch = state.step, [], None, -1
    start = time.perf_counter()
    while step < total:
        epoch, batch = divmod(step, per_epoch)
        if epoch != order_epoch:
            order, order_epoch = torch.from_numpy(epoch_order(state.order_seed, epoch, n)), epoch
        rows = order[batch * size : (batch + 1) * size]
        loss, grads = 0.0, None
        for part in range(accumulate):  # gradients are means over each micro-batch: their mean is the batch's
            inputs = {key: value[rows[part * micro : (part + 1) * micro]] for key, value in data.items()}
            part_loss, _ = programs.forward_backward(inputs)
            if pending:  # that call only made the program's tensors reachable: load the state, run again
                programs.load(state.tensors)
                pending = False
                part_loss, _ = programs.forward_backward(inputs)
            loss += part_loss / accumulate
            if accumulate == 1:
                grads = programs.gradients()
            elif grads is None:
                grads = {name: g.clone() for name, g in programs.gradients().items()}
            else:
                for name, g in programs.gradients().items():
                    grads[name].add_(g)
        if accumulate > 1:
            for g in grads.values():
                g.div_(accumulate)
        update(settings, programs.parameters(), grads, slots, step, lr_at(settings, step, total))
        step += 1
        losses.append(loss)
        if checkpoint_every and step % checkpoint_every == 0 and step < total:
            _save(state_path, programs, slots, step, per_epoch, state.order_seed, examples_sha, manifest)
        if on_step is not None:
            on_step(step, loss)
    _save(state_path, programs, slots, step, per_epoch, state.order_seed, examples_sha, manifest)
    seconds = time.perf_counter() - start
    logger.info("trained %d step(s) in %.1f s; state at step %d in %s", len(losses), seconds, step, state_path)
    return TrainResult(state_path, step, losses, seconds)


def _save(
    path: Path,
    programs: DevicePrograms,
    slots: Mapping[str, Mapping[str, Tensor]],
    step: int,
    per_epoch: int,
    seed: int,
    examples_sha: str,
    manifest: Mapping,
) -> None:
    epoch, batch = divmod(step, per_epoch)
    params = programs.parameters()
    state = DeviceState(
        tensors={name: params[name] for name in programs.names},
        slots={slot: {name: values[name] for name in programs.names} for slot, values in slots.items()},
        step=step,
        epoch=epoch,
        batch=batch,
        order_seed=seed,
        examples_sha256=examples_sha,
    )
    write_state(path, state, manifest)
