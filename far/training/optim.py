"""The optimizers `far.finetune` builds: always over the model's trainable tensors only."""

from __future__ import annotations

from torch import Tensor, nn
from torch.optim import SGD, AdamW, Optimizer

from far.training.adamw import FusedAdamW
from far.training.mezo import MeZO


def trainable_parameters(model: nn.Module) -> list[tuple[str, Tensor]]:
    """(name, parameter) of every tensor with requires_grad=True, tied weights once."""
    seen: set[int] = set()
    result = []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            result.append((name, p))
    return result


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups of the trainable tensors: decayed (2-D and up) and not decayed (biases, norm weights)."""
    params = [p for _, p in trainable_parameters(model)]
    if not params:
        raise ValueError(
            "the model has no trainable parameter (every requires_grad is False); there is nothing to train"
        )
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def _can_fuse(groups: list[dict]) -> bool:
    params = [p for g in groups for p in g["params"]]
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def build_optimizer(
    name: str,
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    mezo_eps: float,
    mezo_directions: int,
    seed: int,
) -> Optimizer | FusedAdamW:
    """A fresh optimizer `name` ("adamw", "sgd" or "mezo") over the model's trainable tensors.

    "sgd" is plain SGD without momentum: no state at all, for priming under a tight memory budget.
    `seed` seeds MeZO's directions; the others ignore it.
    """
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        # fused: one kernel over all tensors; on CPU several times faster than the default per-tensor
        # loop, which would otherwise eat much of what FAR saves in the backward pass. FusedAdamW is that
        # kernel without torch.optim's import of torch._dynamo (docs/design.md, "Resident memory").
        return FusedAdamW(groups, lr=lr) if _can_fuse(groups) else AdamW(groups, lr=lr)
    if name == "sgd":
        return SGD(groups, lr=lr)
    if name == "mezo":
        return MeZO(groups, lr=lr, eps=mezo_eps, n_directions=mezo_directions, seed=seed)
    raise ValueError(f"unknown optimizer {name!r}; use 'adamw', 'sgd' or 'mezo'")
