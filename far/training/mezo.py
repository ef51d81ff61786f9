"""MeZO: zeroth-order fine-tuning in inference memory (Malladi et al., 2023, Algorithm 1).

One step estimates the derivative of the loss along a random Gaussian direction z from two forward
passes, at θ + εz and at θ − εz, and moves the weights along z:

    g = (L(θ + εz) − L(θ − εz)) / 2ε,        θ ← θ − lr · (g · z + λ · θ)

z is never stored. It is drawn again, chunk by chunk, from a local `torch.Generator` seeded from the
optimizer's seed and step counter. Only tensors with requires_grad=True are perturbed, so after
`far.reconfigure` the noise, the perturbation and the update cover the learners and the other
trainable tensors and nothing else (sparse MeZO).

Three passes over the trainable weights per step, each drawing z once: θ → θ + εz, → θ − εz, and
back to θ fused with the update (θ − εz + (ε − lr·g)·z; with weight decay the restore, the decay and
the update are three ops on the same chunk of z). No copy of θ and no per-element bookkeeping.

Restore precision. In float32 fl(fl(fl(θ + εz) − 2εz) + εz) is θ up to rounding: each add is off by
at most half an ulp of its result, so a weight moves by at most ~1.5 ulp(|θ| + 2ε|z|) per step, an
unbiased rounding walk of ~1e-7 relative per step, against an update of lr·g·z
(`experiments/bench_mezo.py` measures both on SmolLM2-135M). In bf16 or fp16 the same round trip
changes about half of the weights by a sizeable fraction of εz every step, and updates of lr·g·z
mostly round away, so MeZO refuses to train half-precision tensors: keep the trainable ones in
float32 (the frozen ones may be anything).

Memory. Besides the model, MeZO holds one 64 KB noise buffer per weight dtype and device
(`far.training.scratch`), reused by every chunk of every step.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor
from torch.optim import Optimizer

from far.seeds import derive_seed
from far.training.scratch import CHUNK, Scratch, scratch_for

_FULL_PRECISION = (torch.float32, torch.float64)
_COUNTERS = ("seed", "steps_taken", "steps_skipped", "n_directions")  # what state_dict()["mezo"] keeps


def _chunks(p: Tensor) -> Iterator[Tensor]:
    """Flat views of a contiguous tensor, CHUNK elements each; writing to a view writes to `p`."""
    flat = p.detach().view(-1)
    for start in range(0, flat.numel(), CHUNK):
        yield flat[start : start + CHUNK]


def _check_number(name: str, value: object, hint: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise TypeError(f"{name} must be a number, got {value!r}; {hint}")
    if (value <= 0 if positive else value < 0) or math.isinf(float(value)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}; {hint}")
    return float(value)


def _loss_value(loss: object) -> float:
    if isinstance(loss, Tensor):
        if loss.numel() != 1:
            raise ValueError(f"the closure must return a scalar loss, got a tensor of shape {tuple(loss.shape)}")
        return float(loss.detach())
    if isinstance(loss, numbers.Real) and not isinstance(loss, bool):
        return float(loss)
    raise TypeError(f"the closure must return the loss (a scalar tensor or a float), got {type(loss).__name__}")


class MeZO(Optimizer):
    """Memory-efficient zeroth-order SGD (MeZO), as a `torch.optim.Optimizer` with a closure step.

    Only tensors with `requires_grad=True` are perturbed and updated, so after `far.reconfigure`
    it trains the learners and the other trainable tensors only (sparse MeZO). No autograd graph is
    built and no `.grad` is read or written. Weight decay is not applied to 1-D tensors (biases,
    norm weights).

    Args:
        params: Parameters or parameter groups, as for any torch optimizer. A group may set its own
            `lr` and `weight_decay`; `eps` must be the same for all groups.
        lr: Learning rate (MeZO's are small: 1e-7 to 1e-5).
        eps: Perturbation scale ε.
        weight_decay: Decoupled L2 factor λ, applied to tensors with 2 or more dimensions.
        n_directions: Random directions per step; their updates are averaged (2 forward passes each).
        seed: Base seed; with the step counter it fixes every direction, so a step can be replayed.

    Example:
        >>> optimizer = far.MeZO(model.parameters(), lr=1e-6, eps=1e-3)
        >>> model.eval()  # MeZO compares two losses: no dropout noise between them
        >>> for batch in batches:
        ...     loss = optimizer.step(lambda: model(**batch).loss)
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-6,
        eps: float = 1e-3,
        weight_decay: float = 0.0,
        n_directions: int = 1,
        seed: int = 0,
    ) -> None:
        defaults = dict(
            lr=_check_number("lr", lr, "e.g. lr=1e-6 (MeZO uses 1e-7 to 1e-5)"),
            eps=_check_number("eps", eps, "the perturbation scale, e.g. eps=1e-3"),
            weight_decay=_check_number("weight_decay", weight_decay, "e.g. 0.0 or 0.01", positive=False),
        )
        if isinstance(n_directions, bool) or not isinstance(n_directions, numbers.Integral) or n_directions < 1:
            raise ValueError(f"n_directions must be an int >= 1, got {n_directions!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {seed!r}")
        super().__init__(params, defaults)
        self.n_directions = int(n_directions)
        self.seed = int(seed)
        self.steps_taken = 0  # including skipped steps: every step draws fresh directions
        self.steps_skipped = 0
        self._scratch: dict[tuple[torch.dtype, torch.device], Scratch] = {}

    def add_param_group(self, param_group: dict) -> None:
        for key, hint in (("lr", "e.g. 1e-6"), ("eps", "e.g. 1e-3")):
            if key in param_group:
                _check_number(key, param_group[key], hint)
        if "weight_decay" in param_group:
            _check_number("weight_decay", param_group["weight_decay"], "e.g. 0.0", positive=False)
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor | float] | None = None) -> float:  # type: ignore[override]
        """One SPSA step; returns the mean of the losses it evaluated (≈ the loss at θ, to O(ε²)).

        Args:
            closure: Computes and returns the loss of the current batch. It is called
                `2 * n_directions` times under `torch.no_grad()`, always on the same batch.

        A NaN or infinite loss skips the step with a warning; the weights are then moved back to θ
        (up to float32 rounding, as after every step) and not updated.
        """
        if closure is None:
            raise TypeError(
                "MeZO.step needs a closure that computes and returns the loss (it evaluates the model "
                "twice per direction), e.g. optimizer.step(lambda: model(**batch).loss)"
            )
        params = self._trainable()
        eps = self._eps(params)
        seeds = [derive_seed(self.seed, self.steps_taken, k) for k in range(self.n_directions)]
        self._scratch = scratch_for([p for p, _ in params], self._scratch)
        losses: list[float] = []
        grads: list[float] = []
        for k, seed in enumerate(seeds):
            at = 0  # where the weights are now: θ + at·εz
            try:
                self._add(params, seed, eps)
                at = 1
                loss_plus = _loss_value(closure())
                losses.append(loss_plus)
                if not math.isfinite(loss_plus):
                    break
                self._add(params, seed, -2 * eps)
                at = -1
                loss_minus = _loss_value(closure())
                losses.append(loss_minus)
                if not math.isfinite(loss_minus):
                    break
                grads.append((loss_plus - loss_minus) / (2 * eps))  # the projected gradient
                if k < len(seeds) - 1:
                    self._add(params, seed, eps)
                else:  # the last restore carries the whole update
                    at = 0
                    self._restore_and_update(params, seeds, grads, eps)
                at = 0
            finally:  # also when the closure raises: never leave the weights perturbed
                if at:
                    self._add(params, seed, -at * eps)
        self.steps_taken += 1
        bad = [x for x in losses if not math.isfinite(x)]
        if bad:
            self.steps_skipped += 1
            warnings.warn(
                f"MeZO step {self.steps_taken}: the loss is {bad[0]}; the step is skipped and the weights are "
                "left as they were (up to rounding). If this repeats, lower lr or eps",
                RuntimeWarning,
                stacklevel=3,
            )
            return bad[0]
        return sum(losses) / len(losses)

    def _trainable(self) -> list[tuple[Tensor, dict]]:
        params = [(p, group) for group in self.param_groups for p in group["params"] if p.requires_grad]
        if not params:
            raise ValueError("MeZO has no parameter with requires_grad=True to train")
        for p, _ in params:
            if p.dtype not in _FULL_PRECISION:
                raise ValueError(
                    f"MeZO trains float32 (or float64) tensors; got a trainable one of dtype {p.dtype}, shape "
                    f"{tuple(p.shape)}. Perturbing it in place and back would change about half of its values "
                    "every step, and updates of lr*g would mostly round away: keep trainable tensors in float32 "
                    "(p.data = p.data.float()), or freeze this one (p.requires_grad_(False))"
                )
            if not p.is_contiguous():
                raise ValueError(
                    f"MeZO trains contiguous tensors; got one of shape {tuple(p.shape)} that is not "
                    "(fix with p.data = p.data.contiguous())"
                )
        return params

    def _eps(self, params: list[tuple[Tensor, dict]]) -> float:
        values = {group["eps"] for _, group in params}
        if len(values) != 1:
            raise ValueError(
                "all MeZO parameter groups must share one eps (the loss difference is divided by it), "
                f"got {sorted(values)}"
            )
        return values.pop()

    def _directions(self, params: list[tuple[Tensor, dict]], seed: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(param index, flat view, z) for every chunk; the same z every time for the same seed.

        z is a scratch buffer, overwritten by the next chunk.
        """
        generators: dict[torch.device, torch.Generator] = {}
        for i, (p, _) in enumerate(params):
            if p.device not in generators:
                generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            for view in _chunks(p):
                z = self._scratch[(view.dtype, view.device)].z[: view.numel()]
                yield i, view, z.normal_(generator=generators[p.device])

    def _add(self, params: list[tuple[Tensor, dict]], seed: int, scale: float) -> None:
        """θ ← θ + scale·z, the perturbation and its restore."""
        for _, view, z in self._directions(params, seed):
            view.add_(z, alpha=scale)

    def _restore_and_update(
        self, params: list[tuple[Tensor, dict]], seeds: list[int], grads: list[float], eps: float
    ) -> None:
        """From θ − εz_last to θ − lr·(Σ_k g_k·z_k / n + λ·θ): one pass per direction."""
        n = len(grads)
        for i, view, z in self._directions(params, seeds[-1]):
            group = params[i][1]
            step = -group["lr"] * grads[-1] / n
            if group["weight_decay"] and params[i][0].dim() >= 2:
                view.add_(z, alpha=eps).mul_(1.0 - group["lr"] * group["weight_decay"]).add_(z, alpha=step)
            else:
                view.add_(z, alpha=eps + step)
        for seed, grad in zip(seeds[:-1], grads[:-1], strict=True):
            for i, view, z in self._directions(params, seed):
                view.add_(z, alpha=-params[i][1]["lr"] * grad / n)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["mezo"] = {name: getattr(self, name) for name in _COUNTERS}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        mezo = state_dict.pop("mezo", None)
        if not isinstance(mezo, dict):
            raise ValueError("not a MeZO state dict (it has no 'mezo' entry); was it saved by far.MeZO.state_dict()?")
        super().load_state_dict(state_dict)
        for name in _COUNTERS:
            setattr(self, name, int(mezo[name]))
