"""What runs a lean causal LM on packed text for the training engine (`far.training.engine`): priming and
split, the frozen bottom's output per chunk (on disk, else in memory), micro-batched steps, scoring with
the function given, checkpoints.

    >>> runner = TextRunner(model, train_ids, validation_ids, layout, training, perplexity, out)
    >>> train(runner, Cadence(training.total_steps, epoch_steps=training.steps_per_epoch), out / "log.jsonl",
    ...       progress=False)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from far.hardware import peak_rss_bytes
from far.llm.bottom_on_disk import keep_bottom_on_disk
from far.llm.lean_checkpoint import read_lean_checkpoint, restore_trained, save_lean_checkpoint
from far.llm.lean_far import Layout, apply_layout
from far.llm.lean_model import LeanCausalLM
from far.llm.lean_saving import round_trained
from far.llm.prefix import PrefixCache
from far.llm.text_budget import PREFIX_CACHE_MIB
from far.llm.text_steps import BATCHED_DIRECTIONS, PRIMING_MICRO_BATCH, TextSteps, priming_loss
from far.seeds import derive_seed
from far.storage.step_folders import CHECKPOINTS
from far.training.distributed import Parallel
from far.training.engine import Start
from far.training.memory import PhaseMemory, release_freed_memory

# perplexity(model, chunks (N, T), batch size, bottom cache) -> {"perplexity", "token_accuracy", "loss", ...}
ScoreFn = Callable[[LeanCausalLM, Tensor, int, PrefixCache | None], dict]
SCORES = ("perplexity", "token_accuracy", "loss")
logger = logging.getLogger(__name__)


def cpu_seconds() -> float:
    """This process's CPU seconds so far (far.recipes.own_texts reads it)."""
    return time.process_time()


@dataclass(frozen=True)
class TextTraining:
    """How a run steps through its chunks; `hyperparameters` (as given) must match on resume."""

    optimizer: str
    lr: float
    batch_size: int
    micro_batch: int
    total_steps: int
    steps_per_epoch: int
    seed: int = 0
    mezo_eps: float = 1e-3
    directions: int = BATCHED_DIRECTIONS
    weight_decay: float = 0.0
    eval_batch: int = 8
    priming_chunks: int = 0
    prefix_cache_mib: float = PREFIX_CACHE_MIB
    resume: bool = False
    hyperparameters: dict = field(default_factory=dict)


class TextRunner:
    """The engine's runner for a `LeanCausalLM` trained with the next-token loss on chunks (N, T) of token ids."""

    def __init__(
        self,
        model: LeanCausalLM,
        train_ids: Tensor,
        validation_ids: Tensor,
        layout: Layout,
        training: TextTraining,
        score: ScoreFn,
        out: Path,
        memory: PhaseMemory | None = None,
        parallel: Parallel | None = None,
    ) -> None:
        self.model, self.train_ids, self.validation_ids = model, train_ids, validation_ids
        # Under torchrun: this process steps on its share of each batch; the first one scores and checkpoints.
        self.parallel = parallel or Parallel()
        self.layout, self.training, self.score, self.out = layout, training, score, out
        self.memory = memory or PhaseMemory()
        self.before: dict = {}
        self.evals: list[dict] = []
        self.primed = self.depth = 0
        self.priming_seconds = self.eval_seconds = 0.0
        self.prior_seconds = self.prior_cpu = self.seconds = self.cpu = 0.0
        self._started = self._cpu_started = 0.0
        self.steps: TextSteps | None = None
        self.train_cache: PrefixCache | None = None
        self.eval_cache: PrefixCache | None = None
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(derive_seed(self.training.seed, epoch))
            self._orders[epoch] = torch.randperm(len(self.train_ids), generator=generator).tolist()
        return self._orders[epoch]

    def rows(self, step: int) -> list[int]:
        """The training chunks of step `step`."""
        epoch, index = divmod(step, self.training.steps_per_epoch)
        size = self.training.batch_size
        return self.order(epoch)[index * size : (index + 1) * size]

    def own_rows(self, step: int) -> list[int]:
        """This process's share of step `step`'s chunks (all of them in a run of one process)."""
        rows = self.rows(step)
        return self.parallel.share(rows) if self.parallel.active else rows

    def begin(self) -> Start:
        training, model, layout = self.training, self.model, self.layout
        resume, trainer_state = None, {}
        if training.resume and (self.out / CHECKPOINTS).is_dir():
            resume, trainer_state = read_lean_checkpoint(self.out)
        priming_started = time.perf_counter()
        if resume is not None:
            if trainer_state["hyperparameters"] != training.hyperparameters:
                raise ValueError(
                    f"--resume continues {self.out} with its own hyper-parameters {trainer_state['hyperparameters']}; "
                    f"these are {training.hyperparameters}: give the same options"
                )
            optimizer_state = restore_trained(model, resume, trainer_state, layout.dtype)
            logger.info("resuming from %s (step %d of %d)", resume, trainer_state["step"], training.total_steps)
        else:
            self.primed = training.priming_chunks if layout.far is not None else 0
            ids = self.train_ids[self.order(0)[: self.primed]]
            micro_batches = [ids[i : i + PRIMING_MICRO_BATCH] for i in range(0, self.primed, PRIMING_MICRO_BATCH)]
            apply_layout(model, layout, micro_batches, priming_loss(layout.frozen_layers))
            # Every process primed on the same chunks: their layouts (and so their trainable tensors) must agree.
            learners = {str(i): weight.stored for i, weight in enumerate(model.trainable_weights())}
            self.parallel.check_same(learners, "trainable tensors after priming")
        self.priming_seconds = time.perf_counter() - priming_started
        self.depth = model.lowest_trainable_layer()
        first = int(trainer_state["step"]) if resume is not None else 0
        self._keep_bottom(first)
        self.steps = TextSteps(
            model,
            training.optimizer,
            training.lr,
            self.train_cache,
            eps=training.mezo_eps,
            directions=training.directions,
            seed=training.seed,
            weight_decay=training.weight_decay,
            parallel=self.parallel,
        )
        release_freed_memory()
        self.memory.mark("priming" if layout.far is not None else "trainable")
        if resume is not None:
            self.steps.load(optimizer_state)
            self.before, self.evals = trainer_state["before"], trainer_state["evals"]
            self.prior_seconds, self.prior_cpu = trainer_state["seconds"], trainer_state["cpu_seconds"]
        else:
            self.before = self._score()
            logger.info("held-out perplexity before training: %.3f", self.before["perplexity"])
        self.memory.mark("evaluation before")
        self._started, self._cpu_started = time.perf_counter(), cpu_seconds()
        return Start(first, resumed=resume is not None, opening={"step": 0, "epoch": 0.0, "eval": self.before})

    def _keep_bottom(self, first: int) -> None:
        """The frozen bottom's output of every chunk read from step `first` on: on disk, else in memory."""
        if not self.depth:
            return
        read = sorted({row for step in range(first, self.training.total_steps) for row in self.own_rows(step)})
        chunks = [self.train_ids[read], self.validation_ids]
        self.train_cache = self.eval_cache = keep_bottom_on_disk(self.model, self.depth, chunks, self.out)
        if self.train_cache is None:  # no room on disk: in memory, as many as fit
            mib = self.training.prefix_cache_mib
            self.train_cache = PrefixCache(self.model, max_bytes=int(mib * 2 / 3 * 2**20))
            self.eval_cache = PrefixCache(self.model, max_bytes=int(mib / 3 * 2**20))

    def step(self, step: int) -> dict:
        rows, own = self.rows(step), self.own_rows(step)
        # A process with no share of a short batch still takes part, with a stand-in chunk that counts for nothing.
        ids, counts = (self.train_ids[own], None) if own else (self.train_ids[rows[:1]], [0])
        micro = self.training.micro_batch
        loss = self.steps([ids[i : i + micro] for i in range(0, len(ids), micro)], counts, whole=len(rows))
        done = step + 1
        epoch = round(done / self.training.steps_per_epoch, 4)
        return {"step": done, "epoch": epoch, "loss": loss, "lr": self.training.lr}

    def rehearse(self, first: int) -> float | None:
        own = self.own_rows(first) or self.rows(first)[:1]
        micro = self.training.micro_batch
        seconds = self.steps.rehearse(self.train_ids[own[:micro]])
        return seconds * math.ceil(len(own) / micro) * (self.training.total_steps - first)

    def switch(self, done: int, record: dict) -> None:
        """Nothing: the split happens before the first step (gradient priming)."""

    def evaluate(self, done: int) -> dict[str, float]:
        scores = self._score()
        self.evals.append({"step": done, "epoch": round(done / self.training.steps_per_epoch, 4), **scores})
        return scores

    def _score(self) -> dict:
        t = time.perf_counter()
        score, batch = self.score, self.training.eval_batch  # the first process scores, the others wait for it
        scores = self.parallel.on_main(score, self.model, self.validation_ids, batch, self.eval_cache)
        self.eval_seconds += time.perf_counter() - t
        return scores

    def measures(self) -> dict[str, float]:
        self.seconds = self.prior_seconds + time.perf_counter() - self._started
        self.cpu = self.prior_cpu + cpu_seconds() - self._cpu_started
        clocks = {"elapsed": round(self.seconds, 3), "cpu_seconds": round(self.cpu, 3)}
        return {**clocks, "peak_rss_bytes": peak_rss_bytes()}

    def save(self, done: int) -> None:
        state = {"ffn": self.layout.ffn, "frozen_layers": self.depth, "hyperparameters": self.training.hyperparameters}
        state.update(before=self.before, evals=self.evals, seconds=self.seconds, cpu_seconds=self.cpu)
        # Written once, by the first process; the others wait until it is whole.
        self.parallel.on_main(save_lean_checkpoint, self.out, done, self.model, self.steps.state(), state)

    def training_seconds(self) -> float:
        """Wall seconds of training (after the scores before it), summed over resumed runs."""
        return self.prior_seconds + time.perf_counter() - self._started

    def final_scores(self, shipped: torch.dtype | None) -> tuple[dict, dict | None]:
        """The last step's scores; when the weights ship in `shipped` but train in another dtype, the shipped
        (rounded in place) model's scores beside the trained precision's.
        """
        total = self.training.total_steps
        final = self.evals[-1] if self.evals and self.evals[-1]["step"] == total else {"step": total, **self._score()}
        if shipped is None or self.layout.dtype == shipped:
            return final, None
        # What ships is what is scored: the weights rounded as the file keeps them, then evaluated again.
        trained_precision = {k: final[k] for k in SCORES}
        round_trained(self.model, shipped)
        return {"step": total, **self._score()}, trained_precision

    def close_bottom(self) -> dict | None:
        """Where the frozen bottom's states were kept and their bytes; gives a file's disk back."""
        cache = self.eval_cache
        if cache is None:
            return None
        on_disk = cache.store is not None
        bottom = {"layers": self.depth, "kept": "disk" if on_disk else "memory", "released": self.model.released_layers}
        bottom["bytes"] = cache.store.bytes if on_disk else cache.bytes
        if on_disk:
            cache.store.close()  # its disk back now (the process's end would give it back too)
        return bottom
