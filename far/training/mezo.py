"""MeZO: zeroth-order fine-tuning in inference memory (Malladi et al., 2023, Algorithm 1).

One step estimates the derivative of the loss along a random Gaussian direction z from two forward
passes, at θ + εz and at θ − εz, and moves the weights along z:

    g = (L(θ + εz) − L(θ − εz)) / 2ε,        θ ← θ − lr · (g · z + λ · θ)

z is never stored. It is drawn again, chunk by chunk, from a local `torch.Generator` seeded from the
optimizer's seed and step counter.

Exact restore. In floating point, fl(fl(θ + εz) − εz) is not always θ: about 2% of MiniLM's
weights come back one or more ulps off (mostly weights smaller than εz), and MeZO's three-pass
+εz, −2εz, +εz leaves about half of them off. So each chunk is perturbed and then the restore's
own arithmetic is run on it at once (same tensors, same kernel, same operands, hence the same
bits as the real restore later); the elements whose bits do not come back are recorded (index and
original value, ~2% of a chunk) and written over by the restore. A step therefore goes
θ → θ+εz → θ → θ−εz → θ, and every weight is bit-identical to its value before the step until
the update is applied.

Memory. Besides the model, MeZO holds fixed scratch buffers (`far.training.scratch`): 2 MB chunks
and room for the records, ~18 MB for MiniLM's 22.7M weights, reused by every step.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor
from torch.optim import Optimizer

from far.training.scratch import CHUNK, Scratch, scratch_for
from far.training.seeds import derive_seed

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: Tensor) -> Tensor:
    """The raw bit patterns of a float tensor (so that -0.0 != 0.0 and NaN == NaN compare as bits)."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def _chunks(p: Tensor) -> Iterator[tuple[int, Tensor]]:
    """(offset, flat view) pieces of a contiguous tensor; writing to a view writes to `p`."""
    flat = p.detach().view(-1)
    for start in range(0, flat.numel(), CHUNK):
        yield start, flat[start : start + CHUNK]


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
        self._saved: dict[tuple[int, int], tuple[int, int]] = {}  # (param, offset) -> where its records are
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

        A NaN or infinite loss skips the step with a warning; the weights are then exactly as before.
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
        for seed in seeds:
            at = 0  # where the weights are now: θ + at·εz
            try:
                self._move(params, seed, eps, at, 1)
                at = 1
                loss_plus = _loss_value(closure())
                losses.append(loss_plus)
                if not math.isfinite(loss_plus):
                    break
                self._move(params, seed, eps, at, -1)
                at = -1
                loss_minus = _loss_value(closure())
                losses.append(loss_minus)
            finally:  # also when the closure raises: never leave the weights perturbed
                if at:
                    self._move(params, seed, eps, at, 0)
                self._saved.clear()
            grads.append((loss_plus - loss_minus) / (2 * eps))  # the projected gradient
        self.steps_taken += 1
        bad = [x for x in losses if not math.isfinite(x)]
        if bad:
            self.steps_skipped += 1
            warnings.warn(
                f"MeZO step {self.steps_taken}: the loss is {bad[0]}; the step is skipped and the weights are "
                "left exactly as they were. If this repeats, lower lr or eps",
                RuntimeWarning,
                stacklevel=3,
            )
            return bad[0]
        self._update(params, seeds, grads)
        return sum(losses) / len(losses)

    def _trainable(self) -> list[tuple[Tensor, dict]]:
        params = [(p, group) for group in self.param_groups for p in group["params"] if p.requires_grad]
        if not params:
            raise ValueError("MeZO has no parameter with requires_grad=True to train")
        for p, _ in params:
            if not p.is_floating_point() or not p.is_contiguous():
                raise ValueError(
                    f"MeZO trains contiguous floating-point tensors; got one of dtype {p.dtype}, shape "
                    f"{tuple(p.shape)}, contiguous={p.is_contiguous()} (fix with p.data = p.data.contiguous())"
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

    def _directions(self, params: list[tuple[Tensor, dict]], seed: int) -> Iterator[tuple[int, int, Tensor, Tensor]]:
        """(param index, offset, view, z) for every chunk; the same z every time for the same seed.

        z is a scratch buffer, overwritten by the next chunk.
        """
        generators: dict[torch.device, torch.Generator] = {}
        for i, (p, _) in enumerate(params):
            if p.device not in generators:
                generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            for start, view in _chunks(p):
                z = self._scratch[(view.dtype, view.device)].z[: view.numel()]
                yield i, start, view, z.normal_(generator=generators[p.device])

    def _move(self, params: list[tuple[Tensor, dict]], seed: int, eps: float, src: int, dst: int) -> None:
        """Move the weights from θ + src·εz to θ + dst·εz (src, dst in {-1, 0, 1}), exactly when dst is 0."""
        if dst:
            for scratch in self._scratch.values():
                scratch.clear(dst)
        for i, start, view, z in self._directions(params, seed):
            n, scratch = view.numel(), self._scratch[(view.dtype, view.device)]
            original, back, inexact = scratch.original[:n], scratch.back[:n], scratch.inexact[:n]
            if src:
                torch.add(view, z, alpha=-src * eps, out=original)  # the same call as `back` below: the same bits
                idx, values = scratch.recorded(src, self._saved.pop((i, start)))
                original[idx] = values  # the elements whose round trip was inexact: now exactly θ
                view.copy_(original)
            elif dst:
                original.copy_(view)
            if dst:
                view.add_(z, alpha=dst * eps)
                torch.add(view, z, alpha=-dst * eps, out=back)
                torch.ne(_bits(back), _bits(original), out=inexact)
                idx = inexact.nonzero().squeeze(1)  # (m,), m ≈ 2% of the chunk
                self._saved[(i, start)] = scratch.record(dst, idx, original)

    def _update(self, params: list[tuple[Tensor, dict]], seeds: list[int], grads: list[float]) -> None:
        for p, group in params:
            if group["weight_decay"] and p.dim() >= 2:
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
        for seed, grad in zip(seeds, grads, strict=True):
            for i, _, view, z in self._directions(params, seed):
                view.add_(z, alpha=-params[i][1]["lr"] * grad / len(grads))

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["mezo"] = {
            "seed": self.seed,
            "steps_taken": self.steps_taken,
            "steps_skipped": self.steps_skipped,
            "n_directions": self.n_directions,
        }
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        mezo = state_dict.pop("mezo", None)
        if not isinstance(mezo, dict):
            raise ValueError("not a MeZO state dict (it has no 'mezo' entry); was it saved by far.MeZO.state_dict()?")
        super().load_state_dict(state_dict)
        self.seed = int(mezo["seed"])
        self.steps_taken = int(mezo["steps_taken"])
        self.steps_skipped = int(mezo["steps_skipped"])
        self.n_directions = int(mezo["n_directions"])
