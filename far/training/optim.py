"""The optimizers `far.finetune` builds, always over the model's trainable tensors only, and their saved state.

An optimizer's state has one saved form, the host's checkpoints' (`far.training.checkpoint`) and the
device's state file's (`far.device.state`) alike: for each trained tensor `<name>`, tensors
`<slot>:<name>` in its dtype, the slots named by `SLOT_NAMES` (torch.optim's state key -> slot), and
one step counter, the optimizer steps taken (AdamW's bias corrections count from it; torch keeps it
per tensor, as a float32 tensor). A state saved by one side loads in the other (tests/test_optimizer_state.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.optim import SGD, AdamW, Optimizer

from far.training.adamw import FusedAdamW
from far.training.mezo import MeZO


def trainable_parameters(model: nn.Module) -> list[tuple[str, Tensor]]:
    """(name, parameter) of every tensor with requires_grad=True, tied weights once (`named_parameters` skips
    a tensor it has yielded)."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


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


SLOT_NAMES = {
    "sgd": {"momentum_buffer": "momentum"},
    "adamw": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
    "mezo": {},  # its directions come from a seed and a step count: no tensor state
}


def optimizer_kind(optimizer: Optimizer | FusedAdamW) -> str:
    """The `SLOT_NAMES` key of an optimizer: "adamw", "sgd" or "mezo"."""
    for kind, classes in (("adamw", (AdamW, FusedAdamW)), ("sgd", (SGD,)), ("mezo", (MeZO,))):
        if isinstance(optimizer, classes):
            return kind
    raise ValueError(f"no saved form for a {type(optimizer).__name__}; far saves AdamW, SGD and MeZO states")


def named_state(optimizer: Optimizer | FusedAdamW, names: Sequence[str]) -> tuple[dict[str, Tensor], int]:
    """The optimizer's state in the saved form: `({"<slot>:<name>": tensor}, steps taken)`.

    Args:
        names: The name of each of the optimizer's tensors, in its order (its groups' in turn).
    """
    kind, tensors, step = optimizer_kind(optimizer), {}, 0
    for number, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            if key == "step":
                step = max(step, int(value))
            elif key in SLOT_NAMES[kind]:
                tensors[f"{SLOT_NAMES[kind][key]}:{names[number]}"] = value
    return tensors, step


def load_named_state(
    optimizer: Optimizer | FusedAdamW,
    names: Sequence[str],
    tensors: Mapping[str, Tensor],
    step: int,
    saved: Mapping | None = None,
) -> None:
    """Go on from a state in the saved form (`named_state`'s, or the device's state file's).

    Args:
        saved: The rest of the saved `state_dict()` (param_groups, MeZO's counters); None keeps the optimizer's.
    """
    kind, state = optimizer_kind(optimizer), {}
    for number, name in enumerate(names):
        slots = SLOT_NAMES[kind].items()
        entry = {key: tensors[f"{slot}:{name}"] for key, slot in slots if f"{slot}:{name}" in tensors}
        if entry:
            state[number] = {"step": torch.tensor(float(step)), **entry} if kind == "adamw" else entry
    optimizer.load_state_dict({**(optimizer.state_dict() if saved is None else saved), "state": state})
