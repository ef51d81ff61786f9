"""One learning-rate schedule over the whole run: linear warmup, then linear decay to zero.

Priming and training share it: the run's steps are counted from the start of priming, and the
optimizer built for training at step `priming_steps` joins the schedule where priming left it.
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupLinear:
    """The factor on the base learning rate at a run step: `warmup` steps up from 0, then down to 0.

    The same formula as transformers' `get_linear_schedule_with_warmup`. It is a callable object,
    not a lambda, so that `LambdaLR.state_dict()` records its fields with the scheduler's state.

    Args:
        total_steps: Steps in the whole run (priming included).
        warmup_steps: Steps of linear warmup at the start of the run.
        offset: Run steps taken before the optimizer this schedule drives was built.
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
