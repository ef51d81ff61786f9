"""The training loop: a run goes through `train`, with what runs the model as a `Runner`.

The engine owns the order of a run and its cadence: start or resume, then step after step the
optimizer step, the switch (FAR's surgery at the end of priming), evaluation, the log line, the
atomic checkpoint and the progress bar. A runner owns the model: how a step is taken on its batch
(micro-batches, accumulation, clipping and the schedule inside), how it is scored, what a checkpoint
keeps and how a run goes on from one. The runners: `far.training.loop.Loop` (a transformers or lean
encoder model, `far.finetune`), `far.llm.text_runner.TextRunner` (the lean GGUF causal LM on a
user's texts), `far.llm.prompt_runner.PromptRunner` (the same model trained by prompts) and
`far.device.train.ProgramRunner` (an ExecuTorch training program, through its Python bindings).

    >>> cadence = Cadence(total_steps=100, eval_every=50, checkpoint_every=25)
    >>> train(runner, cadence, Path("runs/x/log.jsonl"), progress=False)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from far.training.log import RunLog, progress_bar

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cadence:
    """When a run evaluates, logs and checkpoints, in steps done (1 after the first step).

    A run that evaluates does so at the end and as `eval_every` / `epoch_steps` say; the last step's log line,
    and any with an evaluation or the surgery's record, is written whatever `log_every` says.
    """

    total_steps: int
    evaluate: bool = True
    eval_every: int | None = None  # None or 0: not between
    epoch_steps: int | None = None  # also at the end of every epoch of this many steps (None: not by epoch)
    log_every: int = 1
    checkpoint_every: int | None = None
    checkpoint_last: bool = True  # a checkpoint after the last step too: a finished run's state, to go on from

    def __post_init__(self) -> None:
        if self.total_steps < 0 or self.log_every < 1:
            raise ValueError(f"a run needs total_steps >= 0 and log_every >= 1, got {self}")

    def evaluates(self, done: int) -> bool:
        if not self.evaluate:
            return False
        every = (self.eval_every, self.epoch_steps)
        return done == self.total_steps or any(n and done % n == 0 for n in every)

    def logs(self, done: int, record: dict) -> bool:
        if done % self.log_every == 0 or done == self.total_steps:
            return True
        return bool(record.keys() & {"eval", "trainable_parameters"})

    def checkpoints(self, done: int) -> bool:
        if not self.checkpoint_every:
            return False
        if done == self.total_steps:
            return self.checkpoint_last
        return done % self.checkpoint_every == 0


@dataclass(frozen=True)
class Start:
    """Where a run starts: its first step, whether it goes on from a checkpoint, a log line before the first step."""

    first: int
    resumed: bool = False
    opening: dict | None = None  # written when the run does not resume (a causal LM's scores before training)


class Runner(Protocol):
    """What runs the model for `train`: one implementation per runtime."""

    def begin(self) -> Start:
        """Prepare a fresh run (priming, or the surgery up front) or go on from a checkpoint."""

    def rehearse(self, first: int) -> float | None:
        """The seconds steps `first` .. the last will take, from a piece of step `first`'s work timed before it and
        undone (`far.training.rehearsal`); None where nothing can be timed ahead."""

    def step(self, step: int) -> dict:
        """Take optimizer step `step` (0-based) on its batch; the start of its log record (step, loss, lr...)."""

    def switch(self, done: int, record: dict) -> None:
        """After step `done`: the switch from priming to training when it is due, and what it adds to `record`."""

    def evaluate(self, done: int) -> dict[str, float]:
        """Score the model after step `done`."""

    def measures(self) -> dict[str, float]:
        """What each log line measures: the run's seconds so far (summed over resumed runs), its peak memory."""

    def save(self, done: int) -> None:
        """Write a checkpoint of the run after step `done`, whole or not at all."""


def train(
    runner: Runner,
    cadence: Cadence,
    log_path: Path | None,
    *,
    progress: bool,
    on_step: Callable[[dict], None] | None = None,
) -> Start:
    """Run `runner` from its start to `cadence.total_steps`; the log goes to `log_path` (None: no log).

    A resumed run keeps its log's lines up to the checkpoint's step and goes on after them.

    Args:
        on_step: Called with each step's log record, after its checkpoint (if one is due) is written.

    Returns:
        Where the run started.
    """
    start = runner.begin()
    log = RunLog(log_path, resume_step=start.first if start.resumed else None)
    left = cadence.total_steps - start.first
    estimate = _Estimate(start.first, cadence.total_steps, runner.rehearse(start.first) if left > 0 else None)
    try:
        if not start.resumed and start.opening is not None:
            log.write(start.opening)
        with progress_bar(cadence.total_steps, start.first, progress) as bar:
            for step in range(start.first, cadence.total_steps):
                began = time.perf_counter()
                record = runner.step(step)
                done = step + 1
                estimate.step_done(done, time.perf_counter() - began)
                runner.switch(done, record)
                if "trainable_parameters" in record:  # the switch: the steps after it cost what FAR's steps cost
                    estimate.again()
                if cadence.evaluates(done):
                    record["eval"] = runner.evaluate(done)
                record.update(runner.measures())
                if cadence.logs(done, record):
                    log.write(record)
                if cadence.checkpoints(done):
                    runner.save(done)
                bar.update(1)
                bar.set_postfix(_postfix(record))
                if on_step is not None:
                    on_step(record)
        estimate.close()
    finally:
        log.close()
    return start


class _Estimate:
    """Says how many steps a run has and how long they will take, before the first.

    The estimate comes from the runner's rehearsal, a piece of the first step's work timed on this machine under
    its load as they are (evaluation and checkpoints aside). A runner that cannot rehearse has its first step timed
    as it is taken instead. During priming the steps cost what full fine-tuning's do, so FAR's switch to its
    cheaper steps has the first step after it timed again.
    """

    def __init__(self, first: int, total: int, expected: float | None) -> None:
        self.total, self.measure = total, expected is None
        self.expected, self.taken, self.seconds = expected, 0, 0.0
        left = total - first
        if left <= 0:
            return
        since = f", from step {first + 1} of {total}" if first else ""
        steps = f"{left} step{'s'[: left != 1]} to take{since}"
        if expected is None:
            logger.info("%s; an estimate follows the first", steps)
        else:
            logger.info("%s: about %s (a piece of the first step timed; evaluation and checkpoints aside)", steps,
                        _duration(expected))  # fmt: skip

    def again(self) -> None:
        self.measure = True

    def close(self) -> None:
        """Say what the steps took beside what was estimated before the first (a reader's check of the estimate)."""
        if self.expected is not None and self.taken:
            logger.info("the %d steps took %s (estimated before the first: %s)", self.taken, _duration(self.seconds),
                        _duration(self.expected))  # fmt: skip

    def step_done(self, done: int, seconds: float) -> None:
        self.taken, self.seconds = self.taken + 1, self.seconds + seconds
        left = self.total - done
        if not self.measure or left <= 0:
            return
        self.measure = False
        logger.info(
            "step %d took %s: about %s for the %d steps left (evaluation and checkpoints aside)",
            done,
            _duration(seconds),
            _duration(seconds * left),
            left,
        )


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _postfix(record: dict) -> dict[str, str]:
    """The bar's phase, loss and first evaluation score."""
    loss = record.get("loss")
    shown = {"phase": record["phase"]} if "phase" in record else {}
    shown["loss"] = "nan" if loss is None else f"{loss:.4g}"
    for name, value in list(record.get("eval", {}).items())[:1]:
        shown[name] = f"{value:.4g}"
    return shown
