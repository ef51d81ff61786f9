"""One learning-rate schedule over the whole run: linear warmup, then linear decay to zero.

Priming and training share it: the run's steps are counted from the start of priming, and the
optimizer built for training at step `priming_steps` joins the schedule where priming left it.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupLinear:
    """The factor on the base learning rate at a run step: `warmup` steps up from 0, then down to 0.

    The same formula as transformers' `get_linear_schedule_with_warmup`. It is a callable object,
    not a lambda, so that `LambdaLR.state_dict()` records its fields with the scheduler's state. Steps count the
    whole run, priming included; `offset`: the run steps taken before the optimizer it drives was built.
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0, offset: int = 0) -> None:
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.offset = offset

    def __call__(self, scheduler_step: int) -> float:
        step = scheduler_step + self.offset
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def warmup_linear(optimizer: Optimizer, total_steps: int, warmup_steps: int = 0, offset: int = 0) -> LambdaLR:
    """A `LambdaLR` for `optimizer` that follows the run's schedule from run step `offset` on.

    Example:
        >>> scheduler = warmup_linear(optimizer, total_steps=1000, warmup_steps=60)
        >>> optimizer.step(); scheduler.step()
    """
    return LambdaLR(optimizer, WarmupLinear(total_steps, warmup_steps, offset))


class RunSchedule:
    """`WarmupLinear` driving any optimizer with `param_groups` (LambdaLR takes torch.optim optimizers only).

    It sets each group's rate as LambdaLR would (base rate x the schedule at the step, from step 0 at
    construction), and its `state_dict` has LambdaLR's keys, so either restores the other's checkpoint.

    Example:
        >>> schedule = RunSchedule(optimizer, WarmupLinear(total_steps=1000, warmup_steps=60))
        >>> optimizer.step(); schedule.step()
    """

    def __init__(self, optimizer: Any, schedule: WarmupLinear) -> None:
        self.optimizer, self.schedule = optimizer, schedule
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = 0
        self._apply()

    def _apply(self) -> None:
        factor = self.schedule(self.last_epoch)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {
            "base_lrs": list(self.base_lrs),
            "last_epoch": self.last_epoch,
            "_step_count": self.last_epoch + 1,
            "lr_lambdas": [dict(vars(self.schedule))],
        }

    def load_state_dict(self, state: dict) -> None:
        self.base_lrs, self.last_epoch = list(state["base_lrs"]), int(state["last_epoch"])
        lambdas = state.get("lr_lambdas") or [None]
        if lambdas[0]:
            vars(self.schedule).update(lambdas[0])
        self._apply()


def run_schedule(optimizer: Any, total_steps: int, warmup_steps: int = 0, offset: int = 0) -> LambdaLR | RunSchedule:
    """The run's schedule for `optimizer`: a `LambdaLR` for a torch.optim optimizer, else a `RunSchedule`."""
    if isinstance(optimizer, Optimizer):
        return warmup_linear(optimizer, total_steps, warmup_steps, offset)
    return RunSchedule(optimizer, WarmupLinear(total_steps, warmup_steps, offset))
