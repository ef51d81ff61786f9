"""What runs a model for `far.finetune` in the engine: priming, surgery, steps, evaluation, checkpoints."""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from far.architectures import FFNSpec
from far.config import AUTO
from far.freezing import find_layers, freeze_layers, frozen_depth
from far.hardware import peak_rss_bytes
from far.priming import Primer, freeze_embeddings
from far.saving.shared_layout import apply_layout
from far.seeds import derive_seed
from far.surgery.reconfigure import freeze_ffns, reconfigure
from far.surgery.state import learners, node_groups
from far.training.batches import BatchStream, to_device
from far.training.checkpoint import (
    Checkpoint,
    load_model_state,
    load_primer_state,
    load_training_state,
    save_checkpoint,
)
from far.training.distributed import Parallel
from far.training.engine import Cadence, Start, train
from far.training.frozen_bottom import FrozenBottom
from far.training.gradient_priming import gradient_scores, layer_change_shares, split_scores
from far.training.losses import EvalFn, LossFn
from far.training.mezo import MeZO
from far.training.optim import build_optimizer, trainable_parameters
from far.training.plan import TrainingPlan
from far.training.rehearsal import steps_seconds, timed
from far.training.result import FinetuneResult
from far.training.schedule import run_schedule


class Loop:
    """One run of `far.finetune`, the engine's runner (`far.training.engine`) for an encoder: `Loop(...).run(None)`.

    Steps `[0, priming_steps)` train the whole model with the priming optimizer; right after the last of them
    the model is reconfigured and a fresh optimizer is built over its trainable tensors for the steps left.
    """

    def __init__(
        self,
        model: nn.Module,
        stream: BatchStream,
        plan: TrainingPlan,
        *,
        loss_fn: LossFn,
        eval_fn: EvalFn | None,
        output_dir: Path | None,
        spec: FFNSpec | None,
        progress: bool,
        base_weights: Callable[[str], Tensor] | None = None,
        parallel: Parallel | None = None,
    ) -> None:
        self.model, self.stream, self.plan = model, stream, plan
        self.parallel, self.wrapped = parallel or Parallel(), model  # what the steps run: the model, or its wrapper
        self.base_weights = base_weights
        self.loss_fn, self.eval_fn, self.spec, self.progress = loss_fn, eval_fn, spec, progress
        self.output_dir = output_dir
        self.device = next(model.parameters()).device
        self.seconds = {"priming": 0.0, "training": 0.0, "eval": 0.0, "total": 0.0}  # summed over resumed runs
        self.metrics: dict[str, float] = {}
        self.history: list[dict] = []
        self.primer: Primer | None = None
        self.optimizer: Any = None  # a torch.optim optimizer, or far.training.adamw.FusedAdamW
        self.scheduler: Any = None
        self.frozen: FrozenBottom | None = None  # with plan.cache_frozen: the frozen bottom's kept states
        self.layer_change: list[float] | None = None  # each layer's share of priming's change
        self.learner_shares: dict[str, float] | None = None  # each split group's learners / nodes
        self._surgery_record: dict | None = None  # logged with the first step after the surgery
        self.checkpoint: Path | None = None
        self.final_loss: float | None = None
        self._started = self._prior_seconds = 0.0
        self._resume_from, self._batches = None, None  # a Checkpoint; the stream's step batches from the first on

    def run(self, resume: Checkpoint | None = None) -> FinetuneResult:
        plan, was_training = self.plan, self.model.training
        self._started = time.perf_counter()
        self._resume_from = resume
        cadence = Cadence(
            plan.priming_steps if plan.options.stop_after_priming else plan.total_steps,
            evaluate=self.eval_fn is not None and not plan.options.stop_after_priming,
            eval_every=plan.eval_every,
            log_every=plan.log_every,
            checkpoint_every=None if self.output_dir is None else plan.checkpoint_every,
        )
        main = self.parallel.is_main  # the one process that writes the log and the result
        log_path = None if self.output_dir is None or not main else self.output_dir / "log.jsonl"
        try:
            # Dropout draws from torch's global RNG: seed it for this run only; fork_rng puts the
            # caller's RNG state back afterwards.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.parallel.seed(plan.seed))
                train(self, cadence, log_path, progress=self.progress and main)
            self.parallel.unwrap(self.model)  # a sharded model goes back plain, whole in every process
        finally:
            self.model.train(was_training)
        return self._result(log_path)

    def begin(self) -> Start:
        resume = self._resume_from
        first = self._resume(resume) if resume is not None else self._start()
        self._prior_seconds = self.seconds["total"]
        share = self.parallel.share if self.parallel.active else None  # this process's examples of each batch
        self._batches = self.stream.batches(first * self.plan.grad_accum, share)
        return Start(first, resumed=resume is not None)

    def rehearse(self, first: int) -> float | None:
        left, accum = self.plan.total_steps - first, self.plan.grad_accum
        step = [next(self._batches) for _ in range(accum)]  # the first step's batches, given back to the stream
        self._batches, piece = itertools.chain(step, self._batches), step[0][0]
        batch, keys = to_device(piece.batch, self.device), piece.indices
        if isinstance(self.optimizer, MeZO):  # two forward passes a step
            seconds = timed(lambda: self._mean_loss([(batch, 1.0, keys)] * 2), self.device, grad=False)
        else:
            with self.parallel.syncing(self.wrapped, last=False):  # no collective: each process times its own
                seconds = timed(lambda: self._loss(batch, keys).backward(), self.device)
            self.model.zero_grad(set_to_none=True)
        return steps_seconds(seconds, step, left, self.stream, first * accum)

    def switch(self, done: int, record: dict) -> None:
        """Surgery at the end of priming; the surgery's record goes with the first log line after it."""
        if done == self.plan.priming_steps:
            self._reconfigure(done)
        if self._surgery_record is not None:  # the surgery ran at the end of priming, or before step 0
            record.update(self._surgery_record)
            self._surgery_record = None

    def measures(self) -> dict[str, float]:
        self.seconds["total"] = self._prior_seconds + time.perf_counter() - self._started
        return {"elapsed": round(self.seconds["total"], 3), "peak_rss_bytes": peak_rss_bytes()}

    def save(self, done: int) -> None:
        plan = self.plan
        state = {"plan": plan.to_dict(), "seconds": self.seconds, "metrics": self.metrics}
        state.update(layer_change=self.layer_change, learner_shares=self.learner_shares)
        primer = None if self.primer is None else self.primer.state()  # during priming: its snapshot
        written = (self.output_dir, done, self.model, self.optimizer, self.scheduler, state, plan.keep_checkpoints)
        with self.parallel.gathered(self.model, self.optimizer, self._layers):  # whole tensors, whatever the processes
            # Written once; the other processes wait for it.
            self.checkpoint = self.parallel.on_main(save_checkpoint, *written, primer=primer)

    def _start(self) -> int:
        plan, model, t = self.plan, self.model, time.perf_counter()
        if plan.far is None:
            if plan.freeze_ffn:
                freeze_ffns(model, self.spec)
            if plan.freeze_embeddings:
                freeze_embeddings(model)
            if plan.freeze_layers is not None:
                freeze_layers(model, plan.freeze_layers, self.spec)
        elif plan.gradient_priming_steps:
            self._prime_by_gradients()
        elif plan.priming_steps:
            self._freeze_up_front()
            # Snapshot of the FFNs (and heads, when they are to be split) before priming moves them.
            self.primer = self._primer()
        elif plan.options.layout is not None:  # a shared layout's learners: the surgery at step 0, no priming
            apply_layout(model, plan.options.layout, self.spec)
            self._note_surgery()
        else:  # random selection: no scores needed
            reconfigure(model, plan.far, spec=self.spec)
            self._note_surgery()
        self._build(0)
        self.seconds["priming"] += time.perf_counter() - t
        return 0

    def _freeze_up_front(self) -> None:
        plan = self.plan  # priming leaves alone what the surgery freezes anyway (`plan.frozen_from_start`)
        if plan.frozen_from_start:
            if plan.far.freeze_embeddings:
                freeze_embeddings(self.model)
            if plan.far.freeze_layers not in (None, AUTO):
                freeze_layers(self.model, plan.far.freeze_layers, self.spec)

    def _primer(self) -> Primer:
        far = self.plan.far
        return Primer(
            self.model,
            self.spec,
            heads=far.attention_retention is not None,
            # A copy only of what will be frozen: the embeddings, or with depth whole layers and all below.
            embeddings=far.freeze_embeddings and self.plan.reset_frozen,
            everything=far.freeze_layers is not None and self.plan.reset_frozen,
            reference=self.base_weights,
        )

    def _resume(self, checkpoint: Checkpoint) -> int:
        if checkpoint.step < self.plan.priming_steps:  # killed during priming: the Primer's snapshot too
            # Made as at the start, while the model still holds the weights it was loaded with: a Primer that
            # reads them from the model's file (`base_weights`) checks that the two agree.
            self._freeze_up_front()
            self.primer = self._primer()
            self.primer.load_state(load_primer_state(checkpoint))
        load_model_state(self.model, checkpoint, self.spec)
        self._build(checkpoint.step)
        with self.parallel.gathered(self.model, self.optimizer, self._layers):
            load_training_state(checkpoint, self.optimizer, self.scheduler)
        self.seconds.update(checkpoint.trainer_state["seconds"])
        self.metrics = dict(checkpoint.trainer_state.get("metrics", {}))
        self.layer_change = checkpoint.trainer_state.get("layer_change")
        self.learner_shares = checkpoint.trainer_state.get("learner_shares")
        return checkpoint.step

    def _reconfigure(self, step: int) -> None:
        """End of priming: select learners from the priming scores, split the FFNs, rebuild the optimizer.

        Priming's weight changes are kept. Every optimizer state is dropped, the learners' AdamW
        moments included: the learner tensors are new Parameters with their nodes reordered.
        """
        t = time.perf_counter()
        self.parallel.unwrap(self.model)  # the surgery splits whole tensors
        scores = self.primer.scores()
        self.parallel.check_same(scores, "priming scores")  # every process must split its replica alike
        self.layer_change = layer_change_shares(self.model, scores, self.spec)
        head_scores = self.primer.head_scores() if self.primer.watches_heads else None
        self.primer = self.optimizer = self.scheduler = None  # free the priming optimizer's state first
        # The Primer stays attached to the model until reconfigure has put the frozen values back from it.
        far_config, reset = self.plan.far, self.plan.reset_frozen
        reconfigure(self.model, far_config, scores=scores, head_scores=head_scores, spec=self.spec, reset_frozen=reset)
        self._note_surgery()
        self._build(step)
        self.seconds["priming"] += time.perf_counter() - t

    def _prime_by_gradients(self) -> None:
        """Gradient priming: score the first steps' batches without an update, then reconfigure, before step 0.

        Nothing moves, so there is no snapshot to keep and nothing to put back; the scored batches
        are trained on again by the steps that follow, in the same order.
        """
        plan, far_config = self.plan, self.plan.far
        stream = self.stream.batches(0)
        pieces = (
            to_device(piece.batch, self.device)
            for _ in range(plan.gradient_priming_steps * plan.grad_accum)
            for piece in next(stream)
        )
        heads = far_config.attention_retention is not None
        # Encoders here are small: recomputing layers would cost a forward per batch to save memory not needed.
        scores = gradient_scores(
            self.model, pieces, lambda _, batch: self._loss(batch, ()), spec=self.spec, checkpointing=False, heads=heads
        )
        ffn_scores, head_scores = split_scores(self.model, scores, self.spec, heads=heads)
        self.layer_change = layer_change_shares(self.model, ffn_scores, self.spec)
        reconfigure(self.model, far_config, scores=ffn_scores, head_scores=head_scores, spec=self.spec)
        self._note_surgery()

    def _note_surgery(self) -> None:
        """What the surgery chose, for the log line after it and the result: trainable parameters, learner shares."""
        groups = node_groups(self.model, self.spec)
        chosen = learners(self.model, self.spec)
        self.learner_shares = {name: round(idx.numel() / groups[name].n_nodes, 4) for name, idx in chosen.items()}
        self._surgery_record = {
            "trainable_parameters": sum(p.numel() for _, p in trainable_parameters(self.model)),
            "learner_shares": self.learner_shares,
        }

    def _build(self, step: int) -> None:
        """The optimizer and scheduler of the phase that takes step `step`."""
        plan = self.plan
        name = plan.optimizer_at(step)
        # Wrapped again over the tensors the surgery made (MeZO's steps have no gradients to meet).
        self.wrapped = self.model if name == "mezo" else self.parallel.wrap(self.model, self._layers)
        self.optimizer = build_optimizer(
            name,
            self.model,
            lr=plan.lr_at(step),
            weight_decay=plan.weight_decay,
            mezo_eps=plan.mezo_eps,
            mezo_directions=plan.mezo_directions,
            seed=derive_seed(plan.seed, step),
        )
        self.scheduler = run_schedule(self.optimizer, plan.total_steps, plan.warmup_steps, offset=step)
        # MeZO compares two losses of one batch, so no dropout noise between them (as MeZO's own code does).
        self.model.train(name != "mezo")
        self.frozen = self._frozen_bottom()

    def _layers(self) -> list[str]:
        return find_layers(self.model, self.spec)

    def _frozen_bottom(self) -> FrozenBottom | None:
        """The cache of this phase's frozen bottom; None without one (priming before an "auto" depth is known)."""
        if not self.plan.cache_frozen or not self.parallel.keeps_frozen_bottom():
            return None
        k, _, below_frozen = frozen_depth(self.model, self.spec)
        if k == 0 or not below_frozen:
            return None
        return FrozenBottom(self.model, self.spec, max_bytes=int(self.plan.cache_frozen_mib * 2**20))

    def step(self, step: int) -> dict:
        batches = [next(self._batches) for _ in range(self.plan.grad_accum)]  # (grad_accum, micro-batches)
        t = time.perf_counter()
        phase = "priming" if step < self.plan.priming_steps else "training"
        lr = self.optimizer.param_groups[0]["lr"]
        # Every micro-batch's mean loss weighs as its share of the step's examples: the step's mean loss.
        pieces = [piece for batch in batches for piece in batch]
        total = sum(batch[0].whole or sum(p.examples for p in batch) for batch in batches)  # over every process
        weighted = [(to_device(piece.batch, self.device), piece.examples / total, piece.indices) for piece in pieces]
        if isinstance(self.optimizer, MeZO):
            loss = self.optimizer.step(lambda: self._mean_loss(weighted))
        else:
            loss = self._first_order_step(weighted)
        self.scheduler.step()
        self.seconds[phase] += time.perf_counter() - t
        self.final_loss = loss
        return {"step": step + 1, "phase": phase, "loss": loss if math.isfinite(loss) else None, "lr": lr}

    def _loss(self, batch: Any, keys: tuple[int, ...]) -> Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.plan.bf16):
            if self.frozen is None:
                loss = self.loss_fn(self.wrapped, batch)
            else:  # the bottom layers hand back the examples' kept states
                with self.frozen.serving(self.loss_fn, batch, keys):
                    loss = self.loss_fn(self.wrapped, batch)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise TypeError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
        return loss.float()

    def _mean_loss(self, weighted: list[tuple[Any, float, tuple[int, ...]]]) -> float:
        return self.parallel.sum(sum(float(self._loss(batch, keys)) * weight for batch, weight, keys in weighted))

    def _first_order_step(self, weighted: list[tuple[Any, float, tuple[int, ...]]]) -> float:
        optimizer = self.optimizer
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, (batch, weight, keys) in enumerate(weighted):
            with self.parallel.syncing(self.wrapped, last=i == len(weighted) - 1):
                loss = self._loss(batch, keys)
                # Gradient accumulation: the mean over the step's examples (DDP averages over the processes).
                (loss * (weight * self.parallel.world_size)).backward()
            total += float(loss.detach()) * weight
        total = self.parallel.sum(total)  # the same in every process: they skip a step alike
        if not math.isfinite(total):
            optimizer.zero_grad(set_to_none=True)
            warnings.warn(
                f"the loss is {total}; this step is skipped and the weights are left as they were",
                RuntimeWarning,
                stacklevel=2,
            )
            return total
        if self.plan.max_grad_norm:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.plan.max_grad_norm)
        optimizer.step()
        return total

    def evaluate(self, step: int) -> dict[str, float]:
        t, training = time.perf_counter(), self.model.training
        self.model.eval()
        with torch.no_grad():
            metrics = self.parallel.evaluate(self.eval_fn, self.model)  # the first process's scores, handed to all
        self.model.train(training)
        if not isinstance(metrics, Mapping) or not all(isinstance(v, (int, float)) for v in metrics.values()):
            raise TypeError(f"eval_fn must return a dict of metric name -> number, got {metrics!r}")
        self.metrics = {str(k): float(v) for k, v in metrics.items()}
        self.history.append({"step": step, **self.metrics})
        self.seconds["eval"] += time.perf_counter() - t
        return self.metrics

    def _result(self, log_path: Path | None) -> FinetuneResult:
        self.measures()
        params = {id(p): p for p in self.model.parameters()}.values()
        result = FinetuneResult(
            metrics=self.metrics,
            steps=self.plan.total_steps,
            priming_steps=self.plan.priming_steps,
            priming_seconds=self.seconds["priming"],
            training_seconds=self.seconds["training"],
            eval_seconds=self.seconds["eval"],
            total_seconds=self.seconds["total"],
            peak_rss_bytes=peak_rss_bytes(),
            trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
            total_parameters=sum(p.numel() for p in params),
            log_path=None if log_path is None else str(log_path),
            final_loss=self.final_loss,
            checkpoint=None if self.checkpoint is None else str(self.checkpoint),
            frozen_cache_bytes=0 if self.frozen is None else self.frozen.bytes,
            priming_layer_change=self.layer_change,
            learner_shares=self.learner_shares,
            history=self.history,
        )
        if self.output_dir is not None and self.parallel.is_main:
            result.write(self.output_dir / "result.json")
        return result
