"""`train`: the learners of an export folder trained through ExecuTorch's Python bindings, on far's engine.

`ProgramRunner` runs, per step, the export's `accumulate` micro-batches (bottom program, then forward and
backward), averages the gradients and updates the program's own tensors with the manifest's optimizer
(`far.device.optim`). The runtime's own SGD keeps its momentum where it cannot be saved, so the update is
done here, with the optimizer's state in the state file. A run killed at any moment and resumed ends
with the same state as one never interrupted.
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
from far.device.lm_programs import LMPrograms
from far.device.lm_text import is_chunks_file, read_chunks
from far.device.manifest import NEXT_TOKEN, STATE, DeviceFileError, read_manifest
from far.device.optim import lr_at, update
from far.device.order import epoch_order
from far.device.runtime import DevicePrograms
from far.device.state import DeviceState, read_state, trainable_sha256, write_state
from far.training.engine import Cadence, Start
from far.training.engine import train as run_engine
from far.training.options import check_int
from far.training.rehearsal import timed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """What a `train` call did: the state file written, the steps it took and their losses."""

    state_path: Path
    step: int  # optimizer steps taken in all, this call's included
    losses: list[float] = field(default_factory=list)  # this call's, one per step
    seconds: float = 0.0
    evaluations: list[dict] = field(default_factory=list)  # {"step", "loss", "accuracy"} with eval_examples


class ProgramRunner:
    """The engine's runner for an export folder's programs, from `state` to step `total`, saving to `state_path`."""

    def __init__(
        self,
        out_dir: Path,
        manifest: Mapping,
        data: Mapping[str, Tensor],
        examples_sha: str,
        state: DeviceState,
        state_path: Path,
        total: int,
        held_out: Mapping[str, Tensor] | None = None,
    ) -> None:
        self.manifest, self.data, self.examples_sha, self.held_out = manifest, data, examples_sha, held_out
        self.state, self.state_path, self.total = state, state_path, total
        self.micro, self.accumulate = int(manifest["micro_batch_size"]), int(manifest["accumulate"])
        self.per_epoch = _rows(data) // (self.micro * self.accumulate)
        self.text = manifest.get("objective") == NEXT_TOKEN  # chunks of text: no labels, the loss and hits
        self.programs = (LMPrograms if self.text else DevicePrograms)(out_dir, manifest)
        self.slots = {slot: {n: t.clone() for n, t in values.items()} for slot, values in state.slots.items()}
        self._order: tuple[int, Tensor] | None = None  # (epoch, its order)
        self.started = time.perf_counter()

    def begin(self) -> Start:
        state = self.state
        # The program starts at the export's values; a state elsewhere is copied in after a first call
        # (the program's tensors are reachable only from its outputs).
        if state.tensors and trainable_sha256(state.tensors) != self.manifest["state"]["initial_sha256"]:
            self.programs.forward_backward(self._micro_batches(state.step)[0])
            self.programs.load(state.tensors)
        return Start(state.step, resumed=state.step > 0)

    def _micro_batches(self, step: int) -> list[dict[str, Tensor]]:
        epoch, batch = divmod(step, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            n = _rows(self.data)
            self._order = epoch, torch.from_numpy(epoch_order(self.state.order_seed, epoch, n))
        size = self.micro * self.accumulate
        rows = self._order[1][batch * size : (batch + 1) * size]
        parts = [rows[part * self.micro : (part + 1) * self.micro] for part in range(self.accumulate)]
        return [{key: value[part] for key, value in self.data.items()} for part in parts]

    def rehearse(self, first: int) -> float | None:
        inputs = self._micro_batches(first)[0]  # the programs' outputs hold the gradients: nothing else changes
        seconds = timed(lambda: self.programs.forward_backward(inputs), torch.device("cpu"))
        return seconds * self.accumulate * (self.total - first)

    def step(self, step: int) -> dict:
        programs, accumulate = self.programs, self.accumulate
        loss, grads = 0.0, None
        for inputs in self._micro_batches(step):  # gradients are micro-batch means: their mean is the batch's
            loss += programs.forward_backward(inputs)[0] / accumulate
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
        settings = self.manifest["optimizer"]
        lr = lr_at(settings, step, self.total)
        update(settings, programs.parameters(), grads, self.slots, step, lr)
        return {"step": step + 1, "loss": loss, "lr": lr}

    def switch(self, done: int, record: dict) -> None:
        """No switch: the program is FAR's model after the surgery."""

    def evaluate(self, done: int) -> dict[str, float]:
        """The mean loss (and accuracy: for text, the share of next tokens the arg-max predicts) on the held-out
        examples' whole micro-batches, in file order."""
        n, micro, scores = _rows(self.held_out), self.micro, {"loss": 0.0, "accuracy": 0.0}
        for start in range(0, n - n % micro, micro):
            batch = {key: value[start : start + micro] for key, value in self.held_out.items()}
            loss, out = self.programs.forward_backward(batch)
            scores["loss"] += loss / (n // micro)
            if self.text:  # out: the hits among the micro-batch's B * (T - 1) predictions
                accuracy = float(out) / batch["input_ids"][:, 1:].numel()
            else:
                accuracy = float((out.argmax(-1) == batch["labels"]).double().mean())
            scores["accuracy"] += accuracy / (n // micro)
        if not self.text and self.manifest["task"]["kind"] == "regression":
            del scores["accuracy"]
        return scores

    def measures(self) -> dict[str, float]:
        return {"elapsed": round(time.perf_counter() - self.started, 3)}

    def save(self, done: int) -> None:
        epoch, batch = divmod(done, self.per_epoch)
        params, names = self.programs.parameters(), self.programs.names
        state = DeviceState(
            tensors={name: params[name] for name in names},
            slots={slot: {name: values[name] for name in names} for slot, values in self.slots.items()},
            step=done,
            epoch=epoch,
            batch=batch,
            order_seed=self.state.order_seed,
            examples_sha256=self.examples_sha,
        )
        write_state(self.state_path, state, self.manifest)


def _rows(data: Mapping[str, Tensor]) -> int:
    """The examples (or chunks) in `data`."""
    return next(iter(data.values())).shape[0]


def _read_data(
    out_dir: Path, examples: str | os.PathLike, eval_examples: str | os.PathLike | None
) -> tuple[dict, dict[str, Tensor], str, dict[str, Tensor] | None]:
    """(manifest, data, its file's sha256, held-out data): examples for a classifier, chunks of text for a causal LM."""
    if not is_chunks_file(examples):
        manifest = read_manifest(out_dir)
        data, examples_sha = read_examples(examples, manifest)
        held_out = None if eval_examples is None else read_examples(eval_examples, manifest)[0]
        return manifest, data, examples_sha, held_out
    manifest = read_manifest(out_dir, objective=NEXT_TOKEN)
    train, held, examples_sha = read_chunks(examples, manifest)
    if eval_examples is not None and Path(eval_examples) != Path(examples):
        held = read_chunks(eval_examples, manifest)[1]
    return manifest, {"input_ids": train}, examples_sha, None if eval_examples is None else {"input_ids": held}


def _start(manifest: Mapping, state_path: Path, resume: bool, seed: int | None, examples_sha: str) -> DeviceState:
    """The state training starts from: the export's initial one, or `state_path`'s with `resume`."""
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
        return DeviceState(tensors={}, order_seed=check_int("seed", 0 if seed is None else seed, 0))
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
    eval_examples: str | os.PathLike | None = None,
    eval_every: int = 0,
) -> TrainResult:
    """Train an export folder's learners on `examples` for `epochs`, in ExecuTorch, and save the state.

    Args:
        out_dir: The export folder (`export_executorch`).
        examples: An examples file written for it (`write_examples`); at least one batch of them. For a
            causal LM's export (`export_causal_lm`), a chunks file (`far.device.lm_text`, OUT/text.safetensors).
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
        eval_examples: An examples file written for this export, scored at the end of the run (and every
            `eval_every` steps) by the training program's forward: mean loss and, for classification,
            accuracy over its whole micro-batches (the examples past the last whole one are not scored).
            For a causal LM, a chunks file whose held-out chunks are scored (next-token loss and accuracy).

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
    check_int("epochs", epochs, 0)
    check_int("checkpoint_every", checkpoint_every, 0)
    check_int("eval_every", eval_every, 0)
    manifest, data, examples_sha, held_out = _read_data(out_dir, examples, eval_examples)
    if held_out is not None and _rows(held_out) < int(manifest["micro_batch_size"]):
        raise ValueError(f"eval_examples hold fewer examples than one micro-batch of {manifest['micro_batch_size']}")
    state = _start(manifest, state_path, resume, seed, examples_sha)
    n, micro, accumulate = _rows(data), int(manifest["micro_batch_size"]), int(manifest["accumulate"])
    if n // (micro * accumulate) == 0:
        raise ValueError(
            f"{n} examples make no batch of {micro * accumulate} ({accumulate} micro-batch(es) of the programs' "
            f"fixed {micro}); give more examples"
        )
    total = epochs * (n // (micro * accumulate))
    if max_steps is not None:
        total = min(total, check_int("max_steps", max_steps, 1))
    if state.step >= total:
        logger.info("the state is at step %d (epoch %d): %d step(s) are done already", state.step, state.epoch, total)
        return TrainResult(state_path, state.step)
    runner = ProgramRunner(out_dir, manifest, data, examples_sha, state, state_path, total, held_out)
    # checkpoint_every=0: the state is written at the end only (the engine checkpoints at a multiple, and the last).
    every = checkpoint_every or total
    cadence = Cadence(total, evaluate=held_out is not None, eval_every=eval_every, checkpoint_every=every)
    losses: list[float] = []
    evaluations: list[dict] = []

    def each_step(record: dict) -> None:
        losses.append(record["loss"])
        if "eval" in record:
            evaluations.append({"step": record["step"], **record["eval"]})
        if on_step is not None:
            on_step(record["step"], record["loss"])

    run_engine(runner, cadence, None, progress=False, on_step=each_step)
    seconds = time.perf_counter() - runner.started
    logger.info("trained %d step(s) in %.1f s; state at step %d in %s", len(losses), seconds, total, state_path)
    return TrainResult(state_path, total, losses, seconds, evaluations)
