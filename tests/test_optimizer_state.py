"""One saved form of an optimizer's state: a host checkpoint's goes on in the device's update, a device state file's
in the host's optimizer, and checkpoints that hold torch's optimizer.pt (format 2) still resume."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_examples, tiny_model
from safetensors import safe_open
from torch import nn

import far
from far.device.optim import optimizer_settings, update
from far.device.state import DeviceState, read_state, write_state
from far.training import checkpoint as ckpt
from far.training.adamw import FusedAdamW
from far.training.optim import load_named_state, named_state, trainable_parameters
from far.training.schedule import run_schedule

LR, WD = 0.05, 0.01
SETTINGS = {
    "adamw": optimizer_settings("adamw", LR, weight_decay=WD),
    "sgd": optimizer_settings("sgd", LR, momentum=0.9, weight_decay=WD),
}


def host_optimizer(kind: str, params: list[torch.Tensor]):
    """What the host steps with: far's fused AdamW, torch's SGD."""
    if kind == "adamw":
        return FusedAdamW(params, lr=LR, weight_decay=WD)
    return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=WD)


def gradients(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return {name: torch.randn(p.shape, generator=generator) for name, p in trainable_parameters(model)}


def host_steps(model: nn.Module, optimizer, steps: range) -> None:
    for step in steps:
        for (_, p), g in zip(trainable_parameters(model), gradients(model, step).values(), strict=True):
            p.grad = g
        optimizer.step()
        optimizer.zero_grad()


def device_steps(model: nn.Module, kind: str, slots: dict, steps: range) -> None:
    params = dict(trainable_parameters(model))
    for step in steps:
        update(SETTINGS[kind], {n: p.data for n, p in params.items()}, gradients(model, step), slots, step, LR)


def assert_same(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6, msg=name)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).requires_grad_(True)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_host_checkpoints_optimizer_state_goes_on_in_the_device_update(kind, tmp_path):
    host = model()
    optimizer = host_optimizer(kind, [p for _, p in trainable_parameters(host)])
    host_steps(host, optimizer, range(3))
    folder = ckpt.save_checkpoint(tmp_path, 3, host, optimizer, run_schedule(optimizer, 100), {})
    with safe_open(str(folder / "optimizer.safetensors"), framework="pt") as f:
        metadata, saved = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
    slot = {"adamw": "exp_avg", "sgd": "momentum"}[kind]
    assert (
        metadata["optimizer"] == kind
        and f"{slot}:0.weight" in saved
        and saved[f"{slot}:0.weight"].dtype == torch.float32
    )
    step = int(metadata["step"])
    assert step == (3 if kind == "adamw" else 0)  # torch's SGD counts no steps; its momentum needs none
    device = model()
    device.load_state_dict(host.state_dict())
    slots: dict = {}
    for key, value in saved.items():
        slot, _, name = key.partition(":")
        slots.setdefault(slot, {})[name] = value.clone()
    device_steps(device, kind, slots, range(3, 6))
    host_steps(host, optimizer, range(3, 6))
    assert_same(device, host)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_device_state_files_optimizer_state_goes_on_in_the_host_optimizer(kind, tmp_path):
    device, slots = model(), {}
    device_steps(device, kind, slots, range(3))
    names = [name for name, _ in trainable_parameters(device)]
    manifest = {
        "base_fingerprint": "0" * 64,
        "programs": {"train": {"sha256": "1" * 64}},
        "optimizer": SETTINGS[kind],
        "trainable": [{"name": n, "shape": list(p.shape), "dtype": "float32"} for n, p in trainable_parameters(device)],
    }
    tensors = {name: p.data for name, p in trainable_parameters(device)}
    write_state(tmp_path / "state.safetensors", DeviceState(tensors, slots, step=3), manifest)
    state = read_state(tmp_path / "state.safetensors", manifest)
    host = model()
    host.load_state_dict({k: v.clone() for k, v in device.state_dict().items()})
    optimizer = host_optimizer(kind, [p for _, p in trainable_parameters(host)])
    flat = {f"{slot}:{name}": t for slot, values in state.slots.items() for name, t in values.items()}
    load_named_state(optimizer, names, flat, state.step)
    assert named_state(optimizer, names)[0].keys() == flat.keys()
    host_steps(host, optimizer, range(3, 6))
    device_steps(device, kind, slots, range(3, 6))
    assert_same(host, device)


def test_a_checkpoint_with_torchs_optimizer_file_still_resumes(tmp_path, monkeypatch):
    options = dict(optimizer="adamw", lr=1e-2, priming=2, max_steps=6, batch_size=4, weight_decay=0.1, progress=False)
    whole = tiny_model("bert")
    far.finetune(whole, tiny_examples(20), **options)

    def format_2(path, optimizer, model) -> None:  # as far wrote checkpoints of format 2
        torch.save(optimizer.state_dict(), path.parent / "optimizer.pt")

    monkeypatch.setattr(ckpt, "_save_optimizer", format_2)
    monkeypatch.setattr(ckpt, "FORMAT", 2)
    far.finetune(tiny_model("bert"), tiny_examples(20), output_dir=tmp_path / "a", checkpoint_every=4, **options)
    monkeypatch.undo()
    folder = tmp_path / "a" / "checkpoints" / "step-4"
    assert (folder / "optimizer.pt").is_file() and not (folder / "optimizer.safetensors").exists()
    assert json.loads((folder / "trainer_state.json").read_text())["format"] == 2
    resumed = tiny_model("bert")
    far.finetune(resumed, tiny_examples(20), output_dir=tmp_path / "b", resume_from=folder, **options)
    assert_same(resumed, whole)
