"""The device's optimizers: SGD with momentum and AdamW, gradient clipping and the schedule, with named state.

The runtime hands back the gradients of the trainable tensors and lets the caller write the tensors,
so the update is run here on the named tensors, by torch's own optimizers (`torch.optim.SGD` and
`torch.optim.AdamW`, single-tensor, as the host's training loop builds them), with their state kept
in the state file's slots, the saved form of `far.training.optim` that the host's checkpoints share:

- `sgd`: torch.optim.SGD (momentum, dampening, weight decay, Nesterov); slot `momentum` (torch's
  `momentum_buffer`).
- `adamw`: torch.optim.AdamW; slots `exp_avg`, `exp_avg_sq`. Its step count (torch's `state["step"]`)
  is the state's step: the bias corrections count optimizer steps from the state's step + 1.
- `max_grad_norm`: torch.nn.utils.clip_grad_norm_ over all trainable gradients before the update.
- `schedule`: the factor on `lr` at each step, `far.training.schedule.WarmupLinear` (linear warmup,
  then linear decay to zero) at `offset + step`, where `total_steps` None means offset + this run's
  steps; no schedule: a constant lr.

The C++ runner writes the same updates out (runtime/executorch/src/optimizer.cpp); its tests hold it
to this module's numbers (tests/test_device_reference.py writes them). The settings are a plain
dict, as the manifest stores them (`optimizer_settings` builds and checks one).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from torch.nn.utils import clip_grad_norm_
from torch.optim import SGD, AdamW, Optimizer

from far.training.optim import SLOT_NAMES, load_named_state, named_state
from far.training.options import check_float, check_int
from far.training.schedule import WarmupLinear

SLOTS = {kind: tuple(SLOT_NAMES[kind].values()) for kind in ("sgd", "adamw")}  # the state file's slots


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
    settings: dict = {"name": name, "lr": check_float("lr", lr, low=0.0, strict=True)}
    settings["weight_decay"] = check_float("weight_decay", weight_decay, low=0.0)
    if name == "sgd":
        settings["momentum"] = check_float("momentum", momentum, low=0.0, high=1.0)
        settings |= {"dampening": 0.0, "nesterov": False}
    else:
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        settings["betas"] = [check_float(f"betas[{i}]", betas[i], low=0.0, high=1.0) for i in (0, 1)]
        settings["eps"] = check_float("eps", eps, low=0.0, strict=True)
    settings["max_grad_norm"] = (
        None if max_grad_norm is None else check_float("max_grad_norm", max_grad_norm, low=0.0, strict=True)
    )
    if linear_schedule:
        warmup = check_int("warmup_steps", warmup_steps, 0)
        offset = check_int("schedule_offset", schedule_offset, 0)
        if total_steps is not None and check_int("total_steps", total_steps, 1) <= max(warmup, offset):
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
    offset = int(schedule["offset"])
    total = offset + run_steps if schedule["total_steps"] is None else int(schedule["total_steps"])
    return lr * WarmupLinear(total, int(schedule["warmup_steps"]), offset)(step)


def _torch_optimizer(settings: Mapping, params: list[Tensor], lr: float) -> Optimizer:
    wd = float(settings["weight_decay"])
    if settings["name"] == "sgd":
        return SGD(
            params,
            lr=lr,
            momentum=float(settings["momentum"]),
            dampening=float(settings.get("dampening", 0.0)),
            weight_decay=wd,
            nesterov=bool(settings.get("nesterov", False)),
            foreach=False,
        )
    betas = tuple(float(b) for b in settings["betas"])
    return AdamW(params, lr=lr, betas=betas, eps=float(settings["eps"]), weight_decay=wd, foreach=False)


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

    `slots` holds the optimizer's state by slot name (`SLOTS`), filled on the first step (SGD without
    momentum keeps none). `grads` may be scaled in place by clipping.
    """
    names = list(params)
    tensors = [params[n] for n in names]
    for name, tensor in zip(names, tensors, strict=True):
        tensor.grad = grads[name]
    try:
        if settings.get("max_grad_norm") is not None:
            clip_grad_norm_(tensors, float(settings["max_grad_norm"]), foreach=False)
        optimizer = _torch_optimizer(settings, tensors, lr)
        held = {f"{slot}:{name}": t for slot, values in slots.items() for name, t in values.items()}
        load_named_state(optimizer, names, held, step)
        optimizer.step()
        for key, tensor in named_state(optimizer, names)[0].items():
            slot, _, name = key.partition(":")
            slots.setdefault(slot, {})[name] = tensor
    finally:
        for tensor in tensors:
            tensor.grad = None
