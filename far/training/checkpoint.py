"""Checkpoints of a `far.finetune` run: written atomically, resumed to the same weights.

Layout under `output_dir/checkpoints/`::

    step-<N>/model.safetensors   the model's tensors (a FAR model's learner/frozen blocks and node order)
    step-<N>/far.json            the FARConfig (or null) and the names of the trainable tensors
    step-<N>/optimizer.safetensors  optimizer state, in far.training.optim's saved form (the device's state
                                 file's): `<slot>:<name>` tensors; metadata `optimizer`, `step`, the tensors'
                                 `names` in the optimizer's order, `state_dict` (JSON: param_groups, MeZO's counters)
    step-<N>/scheduler.pt        LR scheduler state   } torch.save; read back with
                                                      } torch.load(weights_only=True)
    step-<N>/rng.pt              torch's CPU (and CUDA) RNG state (dropout)
    step-<N>/trainer_state.json  step, the run's plan, seconds spent so far
    step-<N>/primer.safetensors  during priming only: the Primer's pre-priming snapshot
    step-<N>/manifest.json       size and sha256 of every file above
    latest                       the name of the newest complete step folder

Checkpoints of format 2 hold `optimizer.pt` (torch.save of `state_dict()`) instead; they load as well.

A folder appears whole or not at all, and `latest` is replaced only once its folder is complete
(`far.storage.step_folders`), so a process killed mid-write never leaves a broken latest checkpoint.
A checkpoint damaged later (a truncated or altered file) fails its manifest; resuming from a run
then falls back to the newest checkpoint that is intact, with a logged warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from far.architectures import FFNSpec
from far.config import FARConfig
from far.saving.layout import read_layout, rebuild_layout
from far.saving.model_file import load_model_file, save_model_file
from far.storage.step_folders import CHECKPOINTS, LATEST, STEP_DIR, manifest_problem, newest_intact, write_step_folder
from far.surgery.reconfigure import restore
from far.surgery.state import get_config, is_reconfigured
from far.training.adamw import FusedAdamW
from far.training.optim import load_named_state, named_state, optimizer_kind
from far.training.schedule import RunSchedule

FORMAT = 3  # 2: split projections stored node-major (one row per node); 3: optimizer.safetensors
_FILES = ("model.safetensors", "far.json", "scheduler.pt", "rng.pt", "trainer_state.json")
_OPTIMIZER, _OPTIMIZER_PT = "optimizer.safetensors", "optimizer.pt"  # format 3, format 2
_PRIMER = "primer.safetensors"


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: Optimizer | FusedAdamW,
    scheduler: LRScheduler | RunSchedule,
    trainer_state: dict,
    keep: int | None = None,
    primer: dict | None = None,
) -> Path:
    """Write `output_dir/checkpoints/step-<step>/` atomically, point `latest` at it, prune old ones.

    Args:
        trainer_state: JSON-able run state (plan, seconds); `step` and `format` are added.
        keep: How many step folders to keep (the newest); None keeps all.
        primer: During priming, the Primer's snapshot (`Primer.state()`), to resume priming from.

    Returns:
        The checkpoint folder.
    """
    config = get_config(model)
    layout = {
        "far": None if config is None else config.to_dict(),
        "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
    }

    def write(folder: Path) -> None:
        save_model_file(model, folder / "model.safetensors")  # tied tensors are stored once
        (folder / "far.json").write_text(json.dumps(layout, indent=1))
        _save_optimizer(folder / _OPTIMIZER, optimizer, model)
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():  # dropout on a GPU draws from its own generators
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, folder / "rng.pt")
        if primer is not None:
            save_file({k: t.contiguous() for k, t in primer.items()}, str(folder / _PRIMER))
        state = {**trainer_state, "step": step, "format": FORMAT, "primer": primer is not None}
        (folder / "trainer_state.json").write_text(json.dumps(state, indent=1))

    return write_step_folder(output_dir, step, write, keep)


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
    """The checkpoint folder that `path` names: a step folder, a `checkpoints` folder, or a run's output_dir.

    For a run or its `checkpoints` folder, that is the newest checkpoint that is intact (see
    `verify_checkpoint`); skipping a damaged one logs a warning.
    """
    path = Path(path)
    if (path / "trainer_state.json").is_file() or STEP_DIR.match(path.name) and path.is_dir():
        return path
    for root in (path, path / CHECKPOINTS):
        if not ((root / LATEST).is_file() or (root.is_dir() and root.name == CHECKPOINTS)):
            continue
        folder, problems = newest_intact(root, verify_checkpoint)
        if folder is not None:
            return folder
        if problems:
            raise ValueError(f"no intact checkpoint under {str(root)!r}: {'; '.join(problems)}")
    raise ValueError(
        f"no checkpoint at {str(path)!r}: pass a run's output_dir, its checkpoints/ folder or one "
        "checkpoints/step-<N> folder (written by far.finetune(..., output_dir=..., checkpoint_every=...))"
    )


def verify_checkpoint(folder: Path) -> str | None:
    """What a checkpoint folder is if not intact ("incomplete (...)", "corrupted (...)"), or None."""
    if not folder.is_dir():
        return "missing"
    optimizer = _OPTIMIZER if (folder / _OPTIMIZER).is_file() else _OPTIMIZER_PT
    missing = [f for f in (*_FILES, optimizer) if not (folder / f).is_file()]
    if missing:
        return f"incomplete (missing {', '.join(missing)})"
    return manifest_problem(folder, required=False)  # folders written before manifests: their files' presence only


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Find and check a checkpoint (its files intact, its format known); loads no tensors."""
    folder = find_checkpoint(path)
    problem = verify_checkpoint(folder)
    if problem is not None:
        raise ValueError(f"the checkpoint {str(folder)!r} is {problem}")
    state = json.loads((folder / "trainer_state.json").read_text())
    if state.get("format") not in (2, FORMAT):
        raise ValueError(
            f"the checkpoint {str(folder)!r} has format {state.get('format')!r}; this far reads formats 2 and {FORMAT}"
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


def _save_optimizer(path: Path, optimizer: Optimizer | FusedAdamW, model: nn.Module) -> None:
    named = {id(p): name for name, p in model.named_parameters()}  # tied tensors once, by their first name
    names = [named[id(p)] for group in optimizer.param_groups for p in group["params"]]
    tensors, step = named_state(optimizer, names)
    rest = {key: value for key, value in optimizer.state_dict().items() if key != "state"}  # param_groups, MeZO's
    metadata = {"format": "far.optimizer", "optimizer": optimizer_kind(optimizer), "step": str(step)}
    metadata |= {"names": json.dumps(names), "state_dict": json.dumps(rest)}
    save_file({key: t.contiguous() for key, t in tensors.items()}, str(path), metadata=metadata)


def _load_optimizer(folder: Path, optimizer: Optimizer | FusedAdamW) -> None:
    if not (folder / _OPTIMIZER).is_file():  # format 2
        optimizer.load_state_dict(torch.load(folder / _OPTIMIZER_PT, weights_only=True))
        return
    with safe_open(str(folder / _OPTIMIZER), framework="pt") as f:
        metadata, tensors = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
    kind = optimizer_kind(optimizer)
    if metadata["optimizer"] != kind:
        raise ValueError(f"the checkpoint {str(folder)!r} holds a {metadata['optimizer']} state, not {kind}'s")
    names, saved = json.loads(metadata["names"]), json.loads(metadata["state_dict"])
    load_named_state(optimizer, names, tensors, int(metadata["step"]), saved)


def load_training_state(
    checkpoint: Checkpoint, optimizer: Optimizer | FusedAdamW, scheduler: LRScheduler | RunSchedule
) -> None:
    """Load the optimizer, scheduler and RNG states (torch.load with weights_only=True)."""
    folder = checkpoint.path
    _load_optimizer(folder, optimizer)
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    rng = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def load_primer_state(checkpoint: Checkpoint) -> dict:
    """The Primer snapshot of a checkpoint taken during priming."""
    path = checkpoint.path / _PRIMER
    if not path.is_file():
        raise ValueError(f"the checkpoint {str(checkpoint.path)!r} was taken during priming but has no {_PRIMER}")
    return load_file(str(path))
