"""The reference numbers the C++ runner's tests check against (runtime/executorch/tests/data/reference.json).

`far.device.order`'s batch order and `far.device.optim`'s update (SGD with momentum, AdamW, clipping, the
schedule) on small seeded tensors. CTest's `order` and `optimizer` tests hold runtime/executorch to these
numbers; this test holds the Python side to them, so a change on either side shows. After an intended
change of the Python side, write the file again and rebuild the C++ tests:

    python tests/test_device_reference.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from far.device.optim import SLOTS, lr_at, optimizer_settings, update
from far.device.order import epoch_order

FIXTURE = Path(__file__).resolve().parents[1] / "runtime" / "executorch" / "tests" / "data" / "reference.json"
ORDER_CASES = [(0, 0, 5), (7, 0, 22), (7, 1, 22), (123456789, 3, 50), (2**40 + 5, 2, 17), (2**63 + 11, 1, 9)]
SHAPES = {"encoder.weight": [3, 4], "head.bias": [5]}
STEPS = 4
OPTIMIZERS = {
    "sgd_momentum": optimizer_settings("sgd", 0.05, momentum=0.9, weight_decay=0.01),
    "sgd_plain_clipped": optimizer_settings("sgd", 0.1, momentum=0.0, max_grad_norm=0.5),
    "adamw": optimizer_settings("adamw", 1e-2, weight_decay=0.01),
    "adamw_low_beta1_clipped_schedule": optimizer_settings(
        "adamw",
        3e-2,
        betas=(0.3, 0.99),
        eps=1e-6,
        weight_decay=0.1,
        max_grad_norm=1.0,
        linear_schedule=True,
        warmup_steps=2,
        total_steps=7,
        schedule_offset=1,
    ),
}


def _values(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t.reshape(-1).tolist()]


def _optimizer_case(settings: dict, seed: int) -> dict:
    """`STEPS` updates of two float32 tensors by `far.device.optim.update`, with their gradients and results."""
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    case: dict = {"settings": settings, "initial": {n: _values(p) for n, p in params.items()}, "steps": []}
    slots: dict[str, dict[str, torch.Tensor]] = {}
    for step in range(STEPS):
        grads = {n: torch.randn(s, generator=g) * (3.0 if step == 1 else 0.5) for n, s in SHAPES.items()}
        record = {"grads": {n: _values(t) for n, t in grads.items()}}
        lr = lr_at(settings, step, STEPS)
        update(settings, params, {n: t.clone() for n, t in grads.items()}, slots, step, lr)
        record |= {"lr": lr, "params": {n: _values(p) for n, p in params.items()}}
        case["steps"].append(record)
    # The slots it keeps: none for SGD without momentum (C++ and the state file hold none either).
    case["slots"] = {s: {n: _values(t) for n, t in slots[s].items()} for s in SLOTS[settings["name"]] if slots.get(s)}
    return case


def reference() -> dict:
    """Every number the C++ tests compare with, from far's Python code."""
    return {
        "shapes": SHAPES,
        "order": [{"seed": s, "epoch": e, "n": n, "order": epoch_order(s, e, n).tolist()} for s, e, n in ORDER_CASES],
        "optimizers": {name: _optimizer_case(settings, i) for i, (name, settings) in enumerate(OPTIMIZERS.items())},
    }


def _close(a, b, rel: float = 1e-6, abs_: float = 1e-7) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=rel, abs=abs_)
    return a == b


def test_the_batch_order_is_the_committed_one():
    committed = json.loads(FIXTURE.read_text())
    assert reference()["order"] == committed["order"]


def test_the_python_optimizers_give_the_committed_numbers():
    """Within float32 rounding: torch's CPU kernels may vectorize differently from one CPU to another."""
    committed = json.loads(FIXTURE.read_text())
    fresh = reference()
    assert fresh["shapes"] == committed["shapes"]
    for name, case in fresh["optimizers"].items():
        assert _close(case, committed["optimizers"][name]), f"{name} differs from {FIXTURE}; see this file's docstring"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(f"usage: python {sys.argv[0]} --write   (writes {FIXTURE})")
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(reference(), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
