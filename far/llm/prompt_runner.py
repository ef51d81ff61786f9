"""What runs a lean causal LM trained by prompts for the training engine (`far.training.engine`): the layout
(FAR primed on the first examples of the seeded order), the frozen bottom once per prompt, MeZO's steps.
No optimizer state, so no checkpoint; scoring is the recipe's.

    >>> runner = PromptRunner(model, batch_of, loss_fn, label_ids, layout, PromptTraining(100, 16, 1e-6))
    >>> train(runner, Cadence(100, evaluate=False), None, progress=False)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from far.llm.lean_far import Layout, apply_layout
from far.llm.lean_model import LeanCausalLM
from far.llm.prefix import PrefixCache
from far.llm.zo import CompactMeZO
from far.seeds import derive_seed
from far.training.engine import Start
from far.training.memory import PhaseMemory, release_freed_memory
from far.training.rehearsal import timed

PRIMING_MICRO_BATCH = 4
Batch = dict[str, Tensor]  # input_ids and attention_mask (B, T), labels (B,)
LossFn = Callable[[LeanCausalLM, Batch], Tensor]


@dataclass(frozen=True)
class PromptTraining:
    """MeZO on prompts: steps, examples a step, the rate, the perturbation, the seed, gradient-priming batches."""

    steps: int
    batch_size: int
    lr: float
    eps: float = 1e-3
    seed: int = 0
    weight_decay: float = 0.0
    priming_batches: int = 0


class PromptRunner:
    """The engine's runner for MeZO on `n_train` prompted examples, drawn by `batch_of(indices)`.

    Args:
        layout: What trains (None: nothing; the model is only scored).
        loss_fn: The prompt loss on the whole model (priming's, and the steps' without a frozen bottom).
        label_ids: The label words' token ids, for the loss on the frozen bottom's kept output.
    """

    def __init__(
        self,
        model: LeanCausalLM,
        batch_of: Callable[[list[int]], Batch],
        n_train: int,
        loss_fn: LossFn,
        label_ids: Tensor,
        layout: Layout | None,
        training: PromptTraining,
        memory: PhaseMemory | None = None,
    ) -> None:
        self.model, self.batch_of, self.n_train, self.loss_fn = model, batch_of, n_train, loss_fn
        self.label_ids, self.layout, self.training = label_ids, layout, training
        self.memory = memory or PhaseMemory()
        generator = torch.Generator().manual_seed(derive_seed(training.seed, 0))
        self.order = torch.randperm(n_train, generator=generator).tolist()
        self.primed = 0
        self.priming_seconds = 0.0
        self.step_seconds: list[float] = []
        self.train_loss: LossFn = loss_fn
        self.optimizer: CompactMeZO | None = None
        self._started = 0.0

    def indices(self, step: int) -> list[int]:
        """The examples of step `step`: the next `batch_size` of the order, round and round."""
        size, n = self.training.batch_size, self.n_train
        start = (step * size) % n
        return [self.order[(start + j) % n] for j in range(min(size, n))]

    def begin(self) -> Start:
        started, model, layout, training = time.perf_counter(), self.model, self.layout, self.training
        if layout is not None:
            n = training.priming_batches if layout.far is not None else 0
            examples = [self.order[i % self.n_train] for i in range(n * training.batch_size)]
            micro = [
                self.batch_of(examples[i : i + PRIMING_MICRO_BATCH])
                for i in range(0, len(examples), PRIMING_MICRO_BATCH)
            ]
            apply_layout(model, layout, micro, self.loss_fn)
            self.primed = len(examples)
            del micro
            # Below the lowest trainable layer nothing changes: its output is computed once per prompt.
            if model.lowest_trainable_layer() > 0:
                self.train_loss = PrefixCache(model).loss_fn(self.label_ids)
        release_freed_memory()
        self.memory.mark("no training" if layout is None else "priming" if layout.far is not None else "trainable")
        self.priming_seconds = time.perf_counter() - started
        if training.steps:
            self.optimizer = CompactMeZO(
                model, training.lr, training.eps, seed=training.seed, weight_decay=training.weight_decay
            )
        self._started = time.perf_counter()
        return Start(0)

    def step(self, step: int) -> dict:
        batch = self.batch_of(self.indices(step))
        t = time.perf_counter()
        loss = self.optimizer.step(lambda: self.train_loss(self.model, batch))
        self.step_seconds.append(time.perf_counter() - t)
        return {"step": step + 1, "loss": loss}

    def rehearse(self, first: int) -> float | None:
        batch = self.batch_of(self.indices(first))
        # Timed twice: the first pass may fill the frozen bottom's cache, which later steps only read.
        loss = functools.partial(self.train_loss, self.model, batch)
        seconds = min(timed(loss, torch.device("cpu"), grad=False) for _ in range(2))
        return seconds * self.optimizer.forward_passes * (self.training.steps - first)

    def switch(self, done: int, record: dict) -> None:
        """Nothing: the split happens before the first step (gradient priming)."""

    def evaluate(self, done: int) -> dict[str, float]:
        raise NotImplementedError("a prompted run is scored by its recipe after the last step")

    def measures(self) -> dict[str, float]:
        return {}  # a prompted run's log lines are its steps and losses

    def save(self, done: int) -> None:
        raise NotImplementedError("a prompted run keeps no optimizer state to checkpoint")

    def training_seconds(self) -> float:
        return time.perf_counter() - self._started
