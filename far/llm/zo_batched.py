"""A batched one-sided zeroth-order step for the lean runtime (FZOO, Dang et al. 2025), perturbed on read.

The closure runs once at the stored weights, L0, then at n points `w + eps z_i`, and

    w <- w - lr * (1/n) sum_i g_i z_i,    g_i = (L(w + eps z_i) - L0) / eps

n directions cost n + 1 forward passes where n MeZO steps cost 2n. The directions are standard normal
where FZOO draws Rademacher signs: both have E[z z^T] = I, so the estimate is unbiased either way.

    >>> optimizer = CompactBatchedZO(model, lr=1e-4, eps=1e-3, directions=4, seed=0)
    >>> loss = optimizer.step(lambda: loss_fn(model, batch))
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from far.llm.lean_model import LeanCausalLM
from far.llm.zo import CompactZO
from far.seeds import derive_seed


class CompactBatchedZO(CompactZO):
    """One-sided zeroth-order steps over `directions` seeded directions and one shared unperturbed pass."""

    name = "batched ZO"

    def __init__(
        self,
        model: LeanCausalLM,
        lr: float,
        eps: float = 1e-3,
        directions: int = 4,
        seed: int = 0,
        weight_decay: float = 0.0,
    ) -> None:
        if not (isinstance(directions, int) and directions >= 1):
            raise ValueError(f"directions must be an integer >= 1, got {directions!r}; e.g. 4")
        super().__init__(model, lr, eps, seed, weight_decay)
        self.directions = directions
        self.last_projected_grads: list[float] = []

    @property
    def forward_passes(self) -> int:
        """A step's forward passes: the stored weights' and one per direction."""
        return self.directions + 1

    def direction_seed(self, step: int, i: int) -> int:
        """The seed of direction `i` of step `step`: z_i is `perturbation.direction(seed, weight.index, shape)`."""
        return derive_seed(self.seed, step, 2, i)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor | float]) -> float:
        """One step on the closure's batch; returns the loss at the stored weights (before the step)."""
        seeds = [self.direction_seed(self.steps_taken, i) for i in range(self.directions)]
        perturbation = self.model.perturbation
        perturbation.clear()
        loss0 = float(closure())
        losses = []
        try:
            for seed in seeds:
                perturbation.set(seed, self.eps)
                losses.append(float(closure()))
        finally:
            perturbation.clear()
        if not self.count_step(loss0, *losses):
            return loss0
        grads = [(v - loss0) / self.eps for v in losses]
        self.last_projected_grads = grads
        weights = self.model.trainable_weights()
        self.decay(weights)
        # One update per direction, each z_i drawn again from its seed: nothing the size of the model is kept.
        for seed, g in zip(seeds, grads, strict=True):
            for weight in weights:
                weight.update(seed, -self.lr * g / self.directions)
        return loss0
