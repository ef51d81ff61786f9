"""AdamW as `torch.optim.AdamW(fused=True)` computes it, bit for bit, without importing torch._dynamo.

Every `torch.optim.Optimizer` imports torch._dynamo (and sympy with it; docs/design.md, "Resident
memory") the first time it adds a parameter group: its methods are wrapped by
`torch._disable_dynamo`, which imports on first call. A run under a memory budget on the lean
encoder runtime imports nothing else that heavy, so `far.finetune` steps with this class: the same
fused kernel (`torch._fused_adamw_`) over the same state, laid out as torch's AdamW lays it out, so
that `state_dict()` is torch's format and either optimizer loads the other's checkpoints.

    >>> optimizer = FusedAdamW([{"params": weights, "weight_decay": 0.01}], lr=5e-5)
    >>> loss.backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

# torch.optim.AdamW(fused=True)'s defaults and the group keys its state_dict carries.
DEFAULTS = {
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.01,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": True,
    "decoupled_weight_decay": True,
}


class FusedAdamW:
    """AdamW over parameter groups, with `torch.optim.AdamW`'s interface where far's loop uses it.

    Args:
        params: Parameters, or groups (dicts with "params" and any of the defaults' keys).
        lr: Learning rate of every group that does not set its own.
        **defaults: betas, eps, weight_decay (AdamW's defaults otherwise).

    Raises:
        ValueError: a parameter that the fused CPU/CUDA kernel cannot take (not floating point, on
            another device, or in another dtype than the rest of its group).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3, **defaults: Any) -> None:
        unknown = set(defaults) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown AdamW options {sorted(unknown)}; FusedAdamW takes {', '.join(DEFAULTS)}")
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.defaults = {"lr": lr, **DEFAULTS, **defaults}
        self.param_groups: list[dict] = []
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        for group in groups:
            group = {**self.defaults, **group, "params": list(group["params"])}
            for p in group["params"]:
                if not (p.is_floating_point() and p.device.type in ("cpu", "cuda")):
                    raise ValueError(f"the fused AdamW kernel takes floating-point CPU or CUDA tensors, got {p.dtype}")
            self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None) -> Tensor | None:
        """One AdamW step of every parameter that has a gradient (`closure`, if given, computes the loss first)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step(group, [p for p in group["params"] if p.grad is not None])
        return loss

    @torch.no_grad()
    def step_one(self, param: Tensor) -> None:
        """The step of `param` alone, as `step()` would take it: for stepping each tensor as its gradient
        is complete and dropping the gradient then, so that no more than one is ever held."""
        if param.grad is None:
            raise ValueError("step_one needs the parameter's gradient in .grad")
        group = next((g for g in self.param_groups if any(p is param for p in g["params"])), None)
        if group is None:
            raise ValueError("step_one was given a tensor this optimizer does not train")
        self._step(group, [param])

    def _step(self, group: dict, params: list[Tensor]) -> None:
        if not params:
            return
        for p in params:
            if p not in self.state:  # as torch initialises it: a float step counter and zero moments
                self.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
        states = [self.state[p] for p in params]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adamw_(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )

    def state_dict(self) -> dict:
        """torch.optim's format: parameters numbered across the groups in order."""
        index = {}
        groups = []
        for group in self.param_groups:
            numbers = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                numbers.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": numbers})
        params = {id(p): p for group in self.param_groups for p in group["params"]}
        state = {index[i]: dict(self.state[p]) for i, p in params.items() if p in self.state}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load torch.optim.AdamW's (or this class's) `state_dict()`; the groups must match in size."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups, strict=True)
        ):
            raise ValueError("the saved optimizer state has other parameter groups than this optimizer")
        for group, saved_group in zip(self.param_groups, saved, strict=True):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
            for p, number in zip(group["params"], saved_group["params"], strict=True):
                entry = state_dict["state"].get(number)
                if entry is not None:
                    self.state[p] = {
                        k: v.to(device=p.device, dtype=torch.float32 if k == "step" else p.dtype)
                        for k, v in entry.items()
                    }
