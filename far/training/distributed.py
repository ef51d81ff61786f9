"""Data-parallel training over processes (torchrun): what the runners ask of the other processes.

Under `torchrun --nproc_per_node N`, each process takes its share of every global batch (the batch of a
one-process run: the same steps, the same mean loss), and the gradients are averaged by PyTorch's
`DistributedDataParallel` (a lean causal LM, which steps block by block inside backward, sums each block's
gradient itself: `far.llm.text_steps`). Whatever
changes the model (priming's scores, FAR's surgery, a frozen bottom) happens alike in every process, so the
replicas stay identical; the model is wrapped again after the surgery, whose new tensors the old wrapper
does not know. What is written once (checkpoints, logs, the run's files) is written by the first process.

With `shard=True` (`far ... --distributed fsdp`) each process holds a share of every tensor instead of a replica
(FSDP2, `far.training.sharding`): the model is sharded per layer for the steps and gathered whole, into the same
plain modules, where whole tensors are read (the switch's surgery, a checkpoint, the end of the run); every process
then evaluates, as each forward gathers the layers' shares from all of them. A lean causal LM, which steps inside
backward, keeps its trained values whole in every process and shares out AdamW's state instead, each trained
tensor's moments in one process (`far.llm.owned_adamw`, ZeRO's stage 2).

A run of one process (no WORLD_SIZE, or 1) gets `Parallel()`: no process group, and every method below is the
plain one-process operation.

    >>> parallel = Parallel.from_environment()   # under torchrun: joins the process group
    >>> far.finetune(model, examples, "auto", parallel=parallel)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from far.seeds import derive_seed
from far.training.sharding import gather_, is_sharded, shard_

T = TypeVar("T")
logger = logging.getLogger(__name__)
# How long a process waits for the others at a collective before the run fails (rather than hangs): the first
# process evaluates alone while the others wait, so this is larger than an evaluation.
TIMEOUT = timedelta(minutes=30)


class PeerError(ValueError):
    """What the first process raised (mostly a user error: a folder it may not write), raised in the others."""


def writes_outputs() -> bool:
    """Whether this process writes (and checks, and locks) a run's output folder: the only process of a run, or the
    first (RANK 0) of a torchrun run, before its process group is joined."""
    return int(os.environ.get("RANK", "0")) == 0


def check_shardable(optimizers: set[str], micro_batches: bool) -> None:
    """Raise what a sharded run (FSDP2) cannot do that a replicated one (DDP) can: MeZO (`optimizers` holds the run's
    optimizers) and a memory budget's micro-batches."""
    if "mezo" in optimizers or "zo-batched" in optimizers:
        raise ValueError(
            "MeZO cannot run sharded (--distributed fsdp): its directions are drawn per whole tensor, and its "
            "steps exchange only two losses, so every process holds the model anyway; use --distributed ddp"
        )
    if micro_batches:
        raise ValueError(
            "a memory budget's micro-batches cannot run sharded (--distributed fsdp): the processes may take "
            "different numbers of them, and every sharded forward needs all processes; drop --memory-budget, "
            "or use --distributed ddp"
        )


@dataclass(frozen=True)
class Parallel:
    """This process's place in a data-parallel run: its rank and how many processes there are.

    Args:
        rank: This process's number, 0 to `world_size - 1`; 0 writes the run's files.
        world_size: How many processes share each global batch.
        shard: Shard the model over the processes (FSDP2) instead of replicating it (DDP); a lean causal LM shards
            its AdamW state and gradients (`far.llm.owned_adamw`).
    """

    rank: int = 0
    world_size: int = 1
    shard: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not one of the {self.world_size} processes")

    @classmethod
    def from_environment(cls, cuda: bool = False, shard: bool = False) -> Parallel:
        """The run's place from torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK), joining its process group
        unless this process has joined one; `Parallel()` without WORLD_SIZE > 1.

        Args:
            cuda: The model trains on CUDA: the processes talk over NCCL, each on the GPU of its rank on this
                machine (LOCAL_RANK). Else over gloo, on the CPU (where the `far` commands train).
            shard: Shard the model (FSDP2) rather than replicate it (DDP); one process ignores it.
        """
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        if not dist.is_initialized():
            if cuda:
                local, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
                if local >= gpus:
                    raise ValueError(
                        f"process {local} of this machine has no GPU of its own ({gpus} here): start at most "
                        f"{gpus} processes per machine (torchrun --nproc_per_node {gpus})"
                    )
                torch.cuda.set_device(local)
            dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
            # Every process here: each has checked the run's inputs and output folder before the first claims it.
            dist.barrier()
        return cls(dist.get_rank(), dist.get_world_size(), shard=shard)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def seed(self, seed: int) -> int:
        """The seed of this process's own randomness (dropout): the run's in a one-process run, a distinct one per
        process otherwise, as each process drops out on its own examples."""
        return derive_seed(seed, self.rank) if self.active else seed

    def share(self, indices: Sequence[int]) -> list[int]:
        """This process's contiguous share of a global batch's examples (the last processes take one more where
        they do not divide evenly; a process may get none of a batch smaller than the run's processes)."""
        n = len(indices)
        return list(indices[self.rank * n // self.world_size : (self.rank + 1) * n // self.world_size])

    def check_plan(self, optimizers: set[str], micro_batches: bool) -> None:
        """Raise, before anything changes, what a sharded run cannot do (`check_shardable`)."""
        if self.active and self.shard:
            check_shardable(optimizers, micro_batches)

    def wrap(self, model: nn.Module, layers: Callable[[], Sequence[str]] = tuple) -> nn.Module:
        """What the steps run `model` through: the model itself in one process, else its DDP wrapper, or with
        `shard` the model itself sharded per layer (`layers()` names them). Call again after a surgery: DDP's
        reducer is bound to the tensors it wrapped, and FSDP's shards to the tensors it sharded."""
        if not self.active or not any(p.requires_grad for p in model.parameters()):
            return model
        if self.shard:
            return shard_(model, layers())
        device = next(model.parameters()).device
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def unwrap(self, model: nn.Module, optimizer: Any = None) -> nn.Module:
        """`model` plain again, its tensors whole (a sharded model gathered in place, `optimizer` following it);
        the model as it is otherwise."""
        return gather_(model, optimizer) if self.shard else model

    @contextlib.contextmanager
    def gathered(self, model: nn.Module, optimizer: Any, layers: Callable[[], Sequence[str]] = tuple) -> Iterator[None]:
        """Inside: `model` and `optimizer` plain, whole tensors (to write or load a checkpoint); sharded again after,
        if they were."""
        sharded = self.shard and is_sharded(model)
        if sharded:
            gather_(model, optimizer)
        yield
        if sharded:
            shard_(model, layers(), optimizer)

    def evaluate(self, fn: Callable[[nn.Module], T], model: nn.Module) -> T:
        """`fn(model)`: by the first process, its result handed to all; sharded, by every process (each forward
        needs every process's share)."""
        return fn(model) if self.shard else self.on_main(fn, model)

    def keeps_frozen_bottom(self) -> bool:
        """Whether each process may keep its frozen bottom's states (`far.training.frozen_bottom`): not sharded,
        where the bottom's forward needs every process while each would skip it for the examples it keeps."""
        if self.shard and self.active:
            logger.info("the frozen bottom's states are not kept under --distributed fsdp: the bottom runs each step")
        return not (self.shard and self.active)

    @contextlib.contextmanager
    def syncing(self, wrapped: nn.Module, last: bool) -> Iterator[None]:
        """Around one micro-batch's backward: the gradients meet only at the step's last one (processes may hold
        different numbers of micro-batches)."""
        no_sync = getattr(wrapped, "no_sync", None)
        if last or not isinstance(wrapped, DistributedDataParallel) or no_sync is None:
            yield
            return
        with no_sync():
            yield

    def sum(self, value: float) -> float:
        """`value` summed over the processes (a step's loss, each process's share of it)."""
        if not self.active:
            return value
        total = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total)

    def sum_(self, tensor: Tensor) -> None:
        """`tensor` summed over the processes, in place (a gradient that each process's share of the loss made)."""
        if self.active:
            dist.all_reduce(tensor)

    def check_same(self, scores: dict[str, Tensor], what: str) -> None:
        """Raise unless every process holds the same `scores` (each tensor's sum and L1): the replicas must choose
        alike."""
        if not self.active:
            return
        mine = torch.tensor([[float(t.double().sum()), float(t.double().abs().sum())] for t in scores.values()])
        low, high = mine.clone(), mine.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError(
                f"the {what} differ between the processes (largest gap {float((high - low).abs().max()):.3g}): the "
                "replicas drifted apart; every process must start from the same model and options"
            )

    def on_main(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` run by the first process alone, its result (or its error) handed to every process."""
        if not self.active:
            return fn(*args, **kwargs)
        outcome: list[Any] = [None]
        if self.is_main:
            try:
                outcome[0] = ("ok", fn(*args, **kwargs))
            except Exception as error:
                dist.broadcast_object_list([("error", f"{type(error).__name__}: {error}")], src=0)
                raise
        dist.broadcast_object_list(outcome, src=0)
        kind, value = outcome[0]
        if kind == "error":
            raise PeerError(f"the first process failed: {value}")
        return value

    def close(self) -> None:
        """Leave the process group once every process is done with it."""
        if self.active and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
