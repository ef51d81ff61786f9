"""Checkpoints of a `far.finetune` run: written atomically, resumed to the same weights.

Layout under `output_dir/checkpoints/`::

    step-<N>/model.safetensors   the model's tensors (a FAR model's learner/frozen blocks and node order)
    step-<N>/far.json            the FARConfig (or null) and the names of the trainable tensors
    step-<N>/optimizer.pt        optimizer state      } torch.save; read back with
    step-<N>/scheduler.pt        LR scheduler state   } torch.load(weights_only=True)
    step-<N>/rng.pt              torch's CPU RNG state (dropout)
    step-<N>/trainer_state.json  step, the run's plan, seconds spent so far
    latest                       the name of the newest complete step folder

A folder appears whole or not at all (`far.atomic.atomic_dir`), and `latest` is replaced only once
its folder is complete, so a process killed mid-write never leaves a broken latest checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from far.architectures import FFNSpec
from far.atomic import atomic_dir, atomic_file
from far.config import FARConfig
from far.saving.layout import read_layout, rebuild_layout
from far.saving.model_file import load_model_file, save_model_file
from far.surgery import get_config, is_reconfigured, restore

CHECKPOINTS = "checkpoints"
LATEST = "latest"
FORMAT = 2  # 2: split projections stored node-major (one row per node)
_FILES = ("model.safetensors", "far.json", "optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    trainer_state: dict,
    keep: int | None = None,
) -> Path:
    """Write `output_dir/checkpoints/step-<step>/` atomically, point `latest` at it, prune old ones.

    Args:
        trainer_state: JSON-able run state (plan, seconds); `step` and `format` are added.
        keep: How many step folders to keep (the newest); None keeps all.

    Returns:
        The checkpoint folder.
    """
    root = Path(output_dir) / CHECKPOINTS
    target = root / f"step-{step}"
    config = get_config(model)
    layout = {
        "far": None if config is None else config.to_dict(),
        "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
    }
    with atomic_dir(target) as tmp:
        save_model_file(model, tmp / "model.safetensors")  # tied tensors are stored once
        (tmp / "far.json").write_text(json.dumps(layout, indent=1))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step, "format": FORMAT}, indent=1))
    with atomic_file(root / LATEST) as tmp:
        tmp.write_text(target.name)
    if keep is not None:
        old = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p != target)
        for _, path in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(path, ignore_errors=True)
    return target


def has_run(output_dir: str | Path) -> bool:
    """Whether `output_dir` already holds checkpoints of a run."""
    return (Path(output_dir) / CHECKPOINTS / LATEST).is_file()


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's small files, read and checked; the tensors stay on disk until loaded."""

    path: Path
    step: int
    trainer_state: dict
    far_config: FARConfig | None
    trainable: tuple[str, ...]

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder that `path` names: a step folder, a `checkpoints` folder, or a run's output_dir."""
    path = Path(path)
    for candidate in (path, path / CHECKPOINTS):
        if (candidate / "trainer_state.json").is_file():
            return candidate
        pointer = candidate / LATEST
        if pointer.is_file():
            return candidate / pointer.read_text().strip()
    raise ValueError(
        f"no checkpoint at {str(path)!r}: pass a run's output_dir, its checkpoints/ folder or one "
        "checkpoints/step-<N> folder (written by far.finetune(..., output_dir=..., checkpoint_every=...))"
    )


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Find and check a checkpoint (its files present, its format known); loads no tensors."""
    folder = find_checkpoint(path)
    missing = [f for f in _FILES if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"the checkpoint {str(folder)!r} is incomplete (missing {', '.join(missing)})")
    state = json.loads((folder / "trainer_state.json").read_text())
    if state.get("format") != FORMAT:
        raise ValueError(
            f"the checkpoint {str(folder)!r} has format {state.get('format')!r}; this far reads format {FORMAT}"
        )
    layout = json.loads((folder / "far.json").read_text())
    config = None if layout["far"] is None else FARConfig(**layout["far"])
    return Checkpoint(folder, int(state["step"]), state, config, tuple(layout["trainable"]))


def _check_keys(model: nn.Module, folder: Path) -> None:
    """Raise unless the file holds a tensor of the right shape for every tensor of `model`."""
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    own = model.state_dict()
    present = {t.data_ptr() for k, t in own.items() if k in saved and t.numel()}  # empty ones tie to nothing
    wrong = [k for k, t in own.items() if k in saved and tuple(t.shape) != saved[k]]
    missing = [k for k, t in own.items() if k not in saved and t.data_ptr() not in present]  # tied ones are stored once
    unexpected = [k for k in saved if k not in own]
    if wrong or missing or unexpected:
        raise ValueError(
            f"the checkpoint {str(folder)!r} does not fit this model (wrong shape: {wrong[:3]}, "
            f"missing: {missing[:3]}, unexpected: {unexpected[:3]}); resume with the model you started the run with"
        )


def load_model_state(model: nn.Module, checkpoint: Checkpoint, spec: FFNSpec | None = None) -> None:
    """Rebuild the checkpoint's FAR layout on `model` (plain, or already in that layout), then load its weights.

    Everything is checked before the weights are touched; if the check fails after the surgery,
    the surgery is undone, so a failed call leaves the model as it was.
    """
    folder = checkpoint.path
    rebuilt = False
    if checkpoint.far_config is not None:
        rebuilt = not is_reconfigured(model)
        rebuild_layout(model, read_layout([folder / "model.safetensors"]), checkpoint.far_config, spec=spec)
    elif is_reconfigured(model):
        raise ValueError(
            "the checkpoint is of a plain model, but this model is reconfigured by FAR; pass the plain model"
        )
    try:
        _check_keys(model, folder)
        names = {n for n, _ in model.named_parameters()}
        unknown = sorted(set(checkpoint.trainable) - names)
        if unknown:
            raise ValueError(f"the checkpoint trains tensors this model does not have: {unknown[:3]}")
    except ValueError:
        if rebuilt:
            restore(model)
        raise
    load_model_file(model, folder / "model.safetensors", strict=True)
    trainable = set(checkpoint.trainable)
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)


def load_training_state(checkpoint: Checkpoint, optimizer: Optimizer, scheduler: LRScheduler) -> None:
    """Load the optimizer, scheduler and RNG states (torch.load with weights_only=True)."""
    folder = checkpoint.path
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    torch.set_rng_state(torch.load(folder / "rng.pt", weights_only=True)["torch"])
