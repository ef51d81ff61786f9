"""AdamW over a lean causal LM's trained tensors, each tensor owned by one process: `--distributed fsdp` on texts.

This is ZeRO's stage 2 (optimizer state and gradients partitioned), not FSDP's stage 3: every process keeps the
trained values whole, since its forward and backward read them, and the lean runtime steps each learner block
inside backward (`far.llm.backprop`), while FSDP2 gathers and frees whole layers around them. What is partitioned
is what a replicated run holds on top of the values: AdamW's two moments (twice the trained values, fp32); the
gradients are held one learner block at a time anyway. Each trained tensor belongs to one process (`owners`: the
largest first, each to the least loaded process). As backward completes a block's gradient, it is summed into its
owner alone (`reduce`, the others drop theirs), the owner steps it and holds its moments, and the new values go
from the owner to every process (`broadcast`), so every forward reads the same weights: about the bytes of DDP's
all-reduce, in two collectives.

A checkpoint holds AdamW's state whole, as one process writes it: `state_dict` brings every owner's moments to the
first process. `load_state_dict` keeps this process's share of a whole state, so a checkpoint of any number of
processes, sharded or not, goes on under any other.

Every method that exchanges is collective: each process calls it, in the same order (backward's order).

    >>> adamw = OwnedAdamW(gradients.parameters(), Parallel.from_environment(shard=True), lr=1e-4)
    >>> with gradients, gradients.stepping(adamw.step_one), model.input_gradients(), torch.enable_grad():
    ...     loss.backward()
    >>> adamw.step()  # what autograd filled: the norm gains
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from far.training.adamw import FusedAdamW
from far.training.distributed import Parallel

MOMENTS = ("exp_avg", "exp_avg_sq")
logger = logging.getLogger(__name__)


def owners(sizes: Sequence[int], world_size: int) -> list[int]:
    """The process that owns each tensor of `sizes` (values each): the largest first, each to the process holding
    the fewest values so far (the lower rank on a tie), so every process computes the same answer."""
    load, owner = [0] * world_size, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[i], load[rank] = rank, load[rank] + sizes[i]
    return owner


class OwnedAdamW:
    """`FusedAdamW` over `params`, each stepped by its owner alone and its new values broadcast from there.

    Args:
        params: The trained tensors, in the same order in every process (`LearnerGradients.parameters()`).
        parallel: This process's place in the run; one process owns everything (plain AdamW, nothing exchanged).
        lr: Learning rate.
        weight_decay: AdamW's decoupled weight decay.
    """

    def __init__(self, params: Sequence[Tensor], parallel: Parallel, lr: float, weight_decay: float = 0.0) -> None:
        self.params, self.parallel = list(params), parallel
        self.owner = owners([p.numel() for p in self.params], parallel.world_size)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        # Every tensor is in the optimizer (its numbering is the checkpoint's), but only owned ones ever step, so
        # only they get moments: FusedAdamW makes a tensor's state at its first step.
        self.adamw = FusedAdamW(self.params, lr=lr, weight_decay=weight_decay)
        own = [p.numel() for p, owner in zip(self.params, self.owner, strict=True) if owner == parallel.rank]
        logger.info(
            "process %d of %d steps %d of the %d trained tensors (%s of %s values) and keeps their AdamW moments",
            parallel.rank,
            parallel.world_size,
            len(own),
            len(self.params),
            f"{sum(own):,}",
            f"{sum(p.numel() for p in self.params):,}",
        )

    def owns(self, param: Tensor) -> bool:
        return self.owner[self._index[id(param)]] == self.parallel.rank

    def step_one(self, param: Tensor) -> None:
        """`param`'s step: its gradient (this process's part, in `.grad`) summed into its owner, stepped there, the
        new values sent to every process. The gradient is dropped."""
        owner = self.owner[self._index[id(param)]]
        if self.parallel.active:
            dist.reduce(param.grad, dst=owner)
        if owner == self.parallel.rank:
            self.adamw.step_one(param)
        param.grad = None
        if self.parallel.active:
            dist.broadcast(param.detach(), src=owner)

    def step(self) -> None:
        """The step of every tensor holding a gradient (the norm gains, which autograd fills), in order."""
        for p in self.params:
            if p.grad is not None:
                self.step_one(p)

    def held_values(self) -> int:
        """How many values of AdamW's moments this process holds."""
        return sum(state[k].numel() for state in self.adamw.state.values() for k in MOMENTS)

    def state_dict(self) -> dict:
        """AdamW's state whole in the first process, `FusedAdamW.state_dict()`'s format (collective: each owner sends
        its moments there); this process's own share in the others."""
        mine = self.adamw.state_dict()
        if not self.parallel.active:
            return mine
        state, rank = mine["state"], self.parallel.rank
        for i, (p, owner) in enumerate(zip(self.params, self.owner, strict=True)):
            if owner == 0 or rank not in (0, owner):
                continue
            # A flag first: a tensor that never had a gradient has no state.
            if rank == owner:
                held = self.adamw.state.get(p)
                dist.send(torch.tensor([int(held is not None)]), dst=0)
                if held is not None:
                    for key in ("step", *MOMENTS):
                        dist.send(held[key], dst=0)
                continue
            flag = torch.tensor([0])
            dist.recv(flag, src=owner)
            if flag.item():
                state[i] = {"step": torch.tensor(0.0)} | {k: torch.empty_like(p) for k in MOMENTS}
                for key in ("step", *MOMENTS):
                    dist.recv(state[i][key], src=owner)
        return {"state": dict(sorted(state.items())), "param_groups": mine["param_groups"]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Go on from a whole `state_dict` (any run's): this process keeps its own tensors' state only."""
        own = {i: entry for i, entry in state_dict["state"].items() if self.owner[int(i)] == self.parallel.rank}
        self.adamw.load_state_dict({**state_dict, "state": own})
