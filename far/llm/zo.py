"""MeZO for the lean runtime: the perturbation is never written into the stored weights.

`CompactMeZO.step(closure)` is MeZO's SPSA step (Malladi et al., 2023): the closure at (seed, +eps),
then (seed, -eps), and each trainable weight moves by `-lr * g * z`, z drawn again from the seed. The
perturbation is applied on read (`far.llm.compact`): no restore pass, no drift. With `layer_fraction`
below 1 (LeZO, Wang et al. 2024), a step perturbs a random subset of the layers, plus what is outside them.

    >>> optimizer = CompactMeZO(model, lr=1e-4, eps=1e-3, seed=0)
    >>> loss = optimizer.step(lambda: loss_fn(model, batch))
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from far.llm.compact import CompactWeight
from far.llm.lean_model import LeanCausalLM
from far.seeds import derive_seed
from far.training.options import check_float


class CompactZO:
    """Shared by the lean zeroth-order optimizers: checked settings, step counters, skipping a step whose
    losses are not all finite, decoupled weight decay (matrices only).
    """

    name = "zeroth-order"

    def __init__(self, model: LeanCausalLM, lr: float, eps: float, seed: int, weight_decay: float) -> None:
        lr, eps = check_float("lr", lr, low=0, strict=True), check_float("eps", eps, low=0, strict=True)
        if not model.trainable_weights():
            raise ValueError("the model has no trainable weight; mark some with far.llm.lean_far.set_trainable")
        self.model, self.lr, self.eps, self.seed, self.weight_decay = model, lr, eps, seed, weight_decay
        self.steps_taken = 0
        self.steps_skipped = 0

    def count_step(self, *losses: float) -> bool:
        """Count a step; False (with a warning, weights to stay unchanged) when a loss is not finite."""
        self.steps_taken += 1
        if all(math.isfinite(v) for v in losses):
            return True
        self.steps_skipped += 1
        warnings.warn(
            f"{self.name} step {self.steps_taken}: a loss is not finite; the step is skipped, weights unchanged",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

    def decay(self, weights: list[CompactWeight]) -> None:
        """Decoupled L2 on the matrices among `weights`."""
        if self.weight_decay:
            for weight in weights:
                if weight.stored.dim() >= 2:
                    weight.stored.mul_(1.0 - self.lr * self.weight_decay)


class CompactMeZO(CompactZO):
    """MeZO over a `LeanCausalLM`'s trainable weights; `layer_fraction` of the layers perturbed a step (1: all;
    LeZO uses 0.25 or less; one at least).
    """

    name = "MeZO"
    forward_passes = 2  # a step's: at w + eps z and at w - eps z

    def __init__(
        self,
        model: LeanCausalLM,
        lr: float,
        eps: float = 1e-3,
        seed: int = 0,
        weight_decay: float = 0.0,
        layer_fraction: float = 1.0,
    ) -> None:
        if not (isinstance(layer_fraction, (int, float)) and 0 < layer_fraction <= 1):
            raise ValueError(f"layer_fraction must be in (0, 1], got {layer_fraction!r}; e.g. 0.25 (LeZO)")
        super().__init__(model, lr, eps, seed, weight_decay)
        trainable = model.trainable_weights()
        self.layer_fraction = float(layer_fraction)
        in_layer = [{w.index for w in layer.modules() if isinstance(w, CompactWeight)} for layer in model.layers]
        self._layer_weights = [frozenset(w.index for w in trainable if w.index in ids) for ids in in_layer]
        everywhere = set().union(*in_layer) if in_layer else set()
        self._outside_layers = frozenset(w.index for w in trainable if w.index not in everywhere)

    def active_weights(self, step: int) -> frozenset[int] | None:
        """Indices of the weights step `step` perturbs; None: every trainable weight."""
        n_layers = len(self._layer_weights)
        if self.layer_fraction >= 1 or n_layers == 0:
            return None
        drawn = max(1, round(self.layer_fraction * n_layers))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, step, 1))
        layers = torch.randperm(n_layers, generator=generator)[:drawn].tolist()
        return self._outside_layers.union(*(self._layer_weights[i] for i in layers))

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor | float]) -> float:
        """One SPSA step on the closure's batch; returns the mean of the two losses."""
        seed = derive_seed(self.seed, self.steps_taken)
        active = self.active_weights(self.steps_taken)
        perturbation = self.model.perturbation
        try:
            perturbation.set(seed, self.eps, active)
            loss_plus = float(closure())
            perturbation.set(seed, -self.eps, active)
            loss_minus = float(closure())
        finally:
            perturbation.clear()
        if not self.count_step(loss_plus, loss_minus):
            return loss_plus if not math.isfinite(loss_plus) else loss_minus
        grad = (loss_plus - loss_minus) / (2 * self.eps)
        self.last_projected_grad = grad
        weights = [w for w in self.model.trainable_weights() if active is None or w.index in active]
        self.decay(weights)
        for weight in weights:
            weight.update(seed, -self.lr * grad)
        return (loss_plus + loss_minus) / 2
