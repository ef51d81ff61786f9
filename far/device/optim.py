"""The device's optimizers, written out: SGD with momentum and AdamW, gradient clipping and the schedule.

The runtime hands back the gradients of the trainable tensors and lets the caller write the tensors,
so the update is done here (and in the C++ runner's optimizer.h), op for op as torch does it, with
its state in the state file:

- `sgd`: torch.optim.SGD (momentum, dampening, weight decay, Nesterov); slot `momentum`.
- `adamw`: torch.optim.AdamW's single-tensor update; slots `exp_avg`, `exp_avg_sq`. The bias
  corrections count optimizer steps from the state's step + 1, as torch's `state["step"]` does.
- `max_grad_norm`: torch.nn.utils.clip_grad_norm_ over all trainable gradients before the update.
- `schedule`: the factor on `lr` at each step, `far.training.schedule.WarmupLinear`'s formula (linear
  warmup, then linear decay to zero) at `offset + step`, where `total_steps` None means offset + this
  run's steps; no schedule: a constant lr.

The settings are a plain dict, as the manifest stores them (`optimizer_settings` builds and checks one).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch
from torch import Tensor

SLOTS = {"sgd": ("momentum",), "adamw": ("exp_avg", "exp_avg_sq")}


def _number(name: str, value: object, low: float, high: float | None = None, *, strict_low: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict_low else value >= low) and (high is None or value < high)
    if not ok:
        bound = f"> {low}" if strict_low else f">= {low}"
        raise ValueError(f"{name} must be a number {bound}{'' if high is None else f' and < {high}'}, got {value!r}")
    return float(value)


def _count(name: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def optimizer_settings(
    name: str,
    lr: float,
    *,
    momentum: float = 0.9,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    schedule_offset: int = 0,
    linear_schedule: bool = False,
) -> dict:
    """The manifest's `optimizer` entry, checked (every runner reads exactly these keys).

    Args:
        name: "sgd" or "adamw".
        lr: The base learning rate.
        momentum: SGD's momentum (no dampening, no Nesterov).
        betas, eps: AdamW's.
        weight_decay: SGD's L2 term, or AdamW's decoupled decay.
        max_grad_norm: Clip the gradients' total L2 norm to this before each update (None: no clipping).
        linear_schedule: Scale lr by linear warmup over `warmup_steps`, then linear decay to zero at
            `total_steps` (None: at `schedule_offset` + the run's steps), evaluated at
            `schedule_offset + step`: a device run that continues a host run's schedule passes the
            host's total and the step it starts at.

    Raises:
        ValueError: an unknown optimizer or a value out of range, with what is allowed.
    """
    if name not in SLOTS:
        raise ValueError(f"the device optimizer must be one of {sorted(SLOTS)}, got {name!r}")
    settings: dict = {"name": name, "lr": _number("lr", lr, 0.0, strict_low=True)}
    settings["weight_decay"] = _number("weight_decay", weight_decay, 0.0)
    if name == "sgd":
        settings |= {"momentum": _number("momentum", momentum, 0.0, 1.0), "dampening": 0.0, "nesterov": False}
    else:
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        settings["betas"] = [_number("betas[0]", betas[0], 0.0, 1.0), _number("betas[1]", betas[1], 0.0, 1.0)]
        settings["eps"] = _number("eps", eps, 0.0, strict_low=True)
    settings["max_grad_norm"] = (
        None if max_grad_norm is None else _number("max_grad_norm", max_grad_norm, 0.0, strict_low=True)
    )
    if linear_schedule:
        warmup = _count("warmup_steps", warmup_steps)
        offset = _count("schedule_offset", schedule_offset)
        if total_steps is not None and _count("total_steps", total_steps, 1) <= max(warmup, offset):
            raise ValueError(
                f"total_steps={total_steps} must exceed warmup_steps={warmup} and schedule_offset={offset}, or be "
                "None (the run's own length)"
            )
        settings["schedule"] = {"kind": "linear", "warmup_steps": warmup, "total_steps": total_steps, "offset": offset}
    else:
        settings["schedule"] = None
    return settings


def lr_at(settings: Mapping, step: int, run_steps: int) -> float:
    """The learning rate of the update that takes the state from `step` to `step + 1` in a run of `run_steps`."""
    schedule = settings.get("schedule")
    lr = float(settings["lr"])
    if not schedule:
        return lr
    offset, warmup = int(schedule["offset"]), int(schedule["warmup_steps"])
    total = offset + run_steps if schedule["total_steps"] is None else int(schedule["total_steps"])
    at = offset + step
    if at < warmup:
        return lr * (at / max(1, warmup))
    return lr * max(0.0, (total - at) / max(1, total - warmup))


@torch.no_grad()
def clip_gradients(grads: Mapping[str, Tensor], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_ (L2, foreach=False) on `grads`, in place."""
    norms = [torch.linalg.vector_norm(g, 2.0) for g in grads.values()]
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads.values():
        g.mul_(coef)


@torch.no_grad()
def update(
    settings: Mapping,
    params: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    slots: dict[str, dict[str, Tensor]],
    step: int,
    lr: float,
) -> None:
    """One optimizer step on `params` in place, `step` being the number of steps taken before it.

    `slots` holds the optimizer's state by slot name (`SLOTS`), filled on the first step. `grads`
    may be scaled in place by clipping.
    """
    if settings.get("max_grad_norm") is not None:
        clip_gradients(grads, float(settings["max_grad_norm"]))
    wd = float(settings["weight_decay"])
    if settings["name"] == "sgd":
        momentum = float(settings["momentum"])
        buffers = slots.setdefault("momentum", {})
        for name, param in params.items():
            d = grads[name]
            if wd != 0:
                d = d.add(param, alpha=wd)
            if momentum != 0:
                buf = buffers.get(name)
                if buf is None:
                    buf = buffers[name] = d.detach().clone()
                else:
                    buf.mul_(momentum).add_(d)
                d = buf
            param.add_(d, alpha=-lr)
        return
    beta1, beta2 = (float(b) for b in settings["betas"])
    eps, count = float(settings["eps"]), step + 1
    exp_avgs, exp_avg_sqs = slots.setdefault("exp_avg", {}), slots.setdefault("exp_avg_sq", {})
    for name, param in params.items():
        grad = grads[name]
        if name not in exp_avgs:
            exp_avgs[name], exp_avg_sqs[name] = torch.zeros_like(param), torch.zeros_like(param)
        exp_avg, exp_avg_sq = exp_avgs[name], exp_avg_sqs[name]
        param.mul_(1 - lr * wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**count
        bias_correction2_sqrt = math.sqrt(1 - beta2**count)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
