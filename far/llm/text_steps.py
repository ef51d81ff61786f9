"""A step of a causal LM's fine-tune on packed text: MeZO's two forward passes, the batched zeroth-order
estimator's n + 1 (`far.llm.zo_batched`), or AdamW's forward and backward, each above the frozen
bottom (`PrefixCache`), the mean loss over micro-batches.

    >>> steps = TextSteps(model, "adamw", 1e-4, PrefixCache(model))
    >>> loss = steps([chunks[:2], chunks[2:4]])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor

from far.llm.backprop import LearnerGradients
from far.llm.lean_model import LeanCausalLM
from far.llm.owned_adamw import OwnedAdamW
from far.llm.prefix import PrefixCache
from far.llm.zo import CompactMeZO
from far.llm.zo_batched import CompactBatchedZO
from far.training.adamw import FusedAdamW
from far.training.distributed import Parallel
from far.training.rehearsal import timed

OPTIMIZERS = ("adamw", "mezo", "zo-batched")
# Gradient priming scores nodes from a few chunks (a backward pass of the layers above the frozen ones each).
MAX_PRIMING_CHUNKS, PRIMING_MICRO_BATCH = 8, 2
# Directions per batched zeroth-order step: 5 forward passes a step, against MeZO's 2.
BATCHED_DIRECTIONS = 4


def priming_loss(depth: int) -> Callable[[LeanCausalLM, Tensor], Tensor]:
    """The next-token loss with backward stopping at layer `depth`: nodes below it get no learners anyway."""

    def loss(model: LeanCausalLM, ids: Tensor) -> Tensor:
        if not depth:
            return model.next_token_loss(ids)
        with torch.no_grad():
            bottom = model.run_layers(model.embed(ids), 0, depth)
        return model.next_token_loss(ids, start=bottom, start_layer=depth)

    return loss


def bottom_states(cache: PrefixCache | None, ids: Tensor) -> Tensor | None:
    """The frozen bottom's output for chunks (B, T), chunk by chunk: a chunk's states then never depend on its
    batch, so a resumed run recomputes them to the bit.
    """
    if cache is None:
        return None
    return torch.cat([cache.hidden(row, torch.ones_like(row)) for row in ids.split(1)])


class TextSteps:
    """One optimizer step on a batch of chunks, in micro-batches."""

    def __init__(
        self,
        model: LeanCausalLM,
        optimizer: str,
        lr: float,
        cache: PrefixCache | None,
        *,
        eps: float = 1e-3,
        seed: int = 0,
        weight_decay: float = 0.0,
        directions: int = BATCHED_DIRECTIONS,
        parallel: Parallel | None = None,
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        self.model, self.cache, self.optimizer_name = model, cache, optimizer
        self.parallel = parallel or Parallel()  # under torchrun: the losses, or the gradients, summed over processes
        self.depth = 0 if cache is None else cache.n_layers
        if optimizer == "mezo":
            self.zeroth_order = CompactMeZO(model, lr, eps, seed=seed, weight_decay=weight_decay)
        elif optimizer == "zo-batched":
            self.zeroth_order = CompactBatchedZO(model, lr, eps, directions, seed=seed, weight_decay=weight_decay)
        else:
            self.gradients = LearnerGradients(model)
            trained = self.gradients.parameters()
            # Sharded (--distributed fsdp): each trained tensor's moments in one process (far.llm.owned_adamw).
            self.owned = self.parallel.active and self.parallel.shard
            if self.owned:
                self.adamw: FusedAdamW | OwnedAdamW = OwnedAdamW(trained, self.parallel, lr, weight_decay)
            else:
                self.adamw = FusedAdamW(trained, lr=lr, weight_decay=weight_decay)

    def state(self) -> dict:
        """What a checkpoint keeps: MeZO's step counters (its directions' seeds), AdamW's moments."""
        if self.optimizer_name != "adamw":
            return {"steps_taken": self.zeroth_order.steps_taken, "steps_skipped": self.zeroth_order.steps_skipped}
        return self.adamw.state_dict()

    def load(self, state: dict) -> None:
        """Go on from a `state()`."""
        if self.optimizer_name != "adamw":
            self.zeroth_order.steps_taken = state["steps_taken"]
            self.zeroth_order.steps_skipped = state["steps_skipped"]
        else:
            self.adamw.load_state_dict(state)

    def __call__(self, micro_batches: list[Tensor], counts: list[int] | None = None, whole: int | None = None) -> float:
        """One step on the batch that `micro_batches` (each (b, T)) make up; returns its mean loss.

        Args:
            counts: The rows each micro-batch counts for (default: its rows; 0 for a process's stand-in piece when
                its share of a data-parallel batch is empty).
            whole: The rows of the step's whole batch, over every process of a data-parallel run (default: the sum
                of `counts`).
        """
        counts = [len(ids) for ids in micro_batches] if counts is None else counts
        n = sum(counts) if whole is None else whole
        starts = [bottom_states(self.cache, ids) for ids in micro_batches]  # once for all zeroth-order passes
        model, depth, parallel = self.model, self.depth, self.parallel
        pieces = list(zip(micro_batches, starts, counts, strict=True))
        if self.optimizer_name != "adamw":

            def closure() -> float:
                return parallel.sum(
                    sum(float(model.next_token_loss(ids, start=s, start_layer=depth)) * c for ids, s, c in pieces) / n
                )

            return self.zeroth_order.step(closure)
        total = 0.0
        with self.gradients, model.input_gradients(), torch.enable_grad():
            for k, (ids, start, count) in enumerate(pieces):
                loss = model.next_token_loss(ids, start=start, start_layer=depth) * (count / n)
                # The last micro-batch completes each block's gradient: step it there and drop the gradient.
                last = k == len(micro_batches) - 1
                with self.gradients.stepping(self._step_one) if last else contextlib.nullcontext():
                    loss.backward()
                total += float(loss.detach())
        if not self.owned:  # the norm gains, whose gradients autograd fills (an owner sums its own)
            for p in self.gradients.parameters():
                if p.grad is not None:
                    parallel.sum_(p.grad)
        self.adamw.step()
        self.gradients.zero()
        return parallel.sum(total)

    def rehearse(self, ids: Tensor) -> float:
        """Seconds one micro-batch of chunks `ids` costs a step (its forward and backward, or a zeroth-order step's
        forward passes), timed with nothing kept: no weight moves, the gradients are dropped."""
        start, model, depth = bottom_states(self.cache, ids), self.model, self.depth
        device = ids.device
        if self.optimizer_name != "adamw":
            passes = self.zeroth_order.forward_passes
            return passes * timed(
                lambda: model.next_token_loss(ids, start=start, start_layer=depth), device, grad=False
            )
        with self.gradients, model.input_gradients():  # as a step's micro-batch that is not its last: no update
            seconds = timed(lambda: model.next_token_loss(ids, start=start, start_layer=depth).backward(), device)
        self.gradients.zero()
        return seconds

    def _step_one(self, param: Tensor) -> None:
        """A learner block's step, its gradient summed over the processes first (in one process: as it is; sharded:
        into its owner, `OwnedAdamW.step_one`)."""
        if not self.owned:
            self.parallel.sum_(param.grad)
        self.adamw.step_one(param)
