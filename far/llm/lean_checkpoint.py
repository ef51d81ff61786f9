"""Checkpoints of a lean causal-LM fine-tune: written whole or not at all, resumed to the same weights.

Layout under `output_dir/checkpoints/`::

    step-<N>/state.pt            trained weights (as stored), learner nodes, optimizer state (torch.save)
    step-<N>/trainer_state.json  step, the trained layout (frozen layers, dtype), evaluations and seconds so far
    step-<N>/manifest.json       size and sha256 of the two files above
    latest                       the name of the newest complete step folder

Only what training changes is kept: the GGUF file holds the rest. torch.save writes each tensor's
storage as it is, so a checkpoint adds no copy of the weights to the run's peak. A folder appears
whole (`far.atomic.atomic_dir`) and `latest` moves only once it has, so a run killed at any moment
leaves its previous checkpoint intact; one damaged later fails its manifest and the one before is used.

    >>> save_lean_checkpoint(out, 40, model, optimizer_state, {"epoch": 1}, keep=2)
    >>> step, state = read_lean_checkpoint(out)        # the newest intact one
    >>> restore_trained(model, state)                  # onto a freshly loaded model
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from far.atomic import atomic_dir, atomic_file, file_sha256
from far.llm.compact import CompactWeight
from far.llm.lean_far import ffn_names, set_trainable, split_ffns
from far.llm.lean_model import LeanCausalLM

CHECKPOINTS, LATEST = "checkpoints", "latest"
STATE_FILE, TRAINER_FILE, MANIFEST = "state.pt", "trainer_state.json", "manifest.json"
FORMAT = "far-lean-lm-checkpoint/1"
_STEP_DIR = re.compile(r"^step-(\d+)$")
logger = logging.getLogger(__name__)


def trained_state(model: LeanCausalLM) -> dict[str, dict[str, Tensor]]:
    """The trainable weights by module name (their storage itself, not copies) and each FFN's learner nodes."""
    weights = {
        name: m.stored.detach() for name, m in model.named_modules() if isinstance(m, CompactWeight) and m.trainable
    }
    learners = {
        name: layer.mlp.learner_nodes
        for name, layer in zip(ffn_names(model), model.layers, strict=True)
        if layer.mlp.learner_nodes is not None
    }
    return {"weights": weights, "learners": learners}


def save_lean_checkpoint(
    output_dir: str | Path,
    step: int,
    model: LeanCausalLM,
    optimizer_state: dict | None,
    trainer_state: dict,
    keep: int | None = 2,
) -> Path:
    """Write `output_dir/checkpoints/step-<step>/` atomically, point `latest` at it, keep the newest `keep`."""
    root = Path(output_dir) / CHECKPOINTS
    target = root / f"step-{step}"
    with atomic_dir(target) as tmp:
        torch.save({**trained_state(model), "optimizer": optimizer_state}, tmp / STATE_FILE)
        (tmp / TRAINER_FILE).write_text(json.dumps({**trainer_state, "step": step, "format": FORMAT}, indent=1))
        manifest = {
            n: {"bytes": (tmp / n).stat().st_size, "sha256": file_sha256(tmp / n)} for n in (STATE_FILE, TRAINER_FILE)
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    with atomic_file(root / LATEST) as tmp:
        tmp.write_text(target.name)
    if keep is not None:
        old = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p != target)
        for _, path in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(path, ignore_errors=True)
    return target


def _problem(folder: Path) -> str | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return "incomplete (no readable manifest.json)"
    for name, entry in manifest.items():
        file = folder / name
        if not file.is_file() or file.stat().st_size != entry["bytes"] or file_sha256(file) != entry["sha256"]:
            return f"corrupted ({name} does not match its size and sha256)"
    return None


def read_lean_checkpoint(output_dir: str | Path) -> tuple[Path, dict]:
    """The newest intact checkpoint of a run (its folder and trainer state); damaged ones are skipped with a warning.

    Raises:
        ValueError: the run has no intact checkpoint.
    """
    root = Path(output_dir) / CHECKPOINTS
    folders = sorted(
        ((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ()) if (m := _STEP_DIR.match(p.name))),
        reverse=True,
    )
    problems = []
    for _, folder in folders:
        problem = _problem(folder)
        if problem is None:
            state = json.loads((folder / TRAINER_FILE).read_text())
            if state.get("format") != FORMAT:
                raise ValueError(f"{folder} is not a checkpoint of a lean causal-LM run ({FORMAT})")
            if problems:
                logger.warning("skipping damaged checkpoints (%s); resuming from %s", "; ".join(problems), folder)
            return folder, state
        problems.append(f"{folder.name}: {problem}")
    detail = f": {'; '.join(problems)}" if problems else ""
    raise ValueError(f"no intact checkpoint under {root}{detail}; start the run again without --resume")


def restore_trained(model: LeanCausalLM, folder: Path, state: dict, dtype: torch.dtype) -> dict | None:
    """Put a checkpoint's layout and weights onto `model`, freshly loaded from the same GGUF file; returns the
    optimizer state. Every saved weight's name and shape is checked against the layout before any is loaded.

    Raises:
        ValueError: the checkpoint does not fit this model (which may then be split already: load a fresh one).
    """
    saved = torch.load(folder / STATE_FILE, weights_only=True)
    learners, weights = saved["learners"], saved["weights"]
    if learners and set(learners) != set(ffn_names(model)):
        raise ValueError(f"{folder} has learners for {len(learners)} FFNs, this model has {len(model.layers)}")
    if learners:
        split_ffns(model, learners, dtype)
    set_trainable(model, state["ffn"], dtype, frozen_layers=state["frozen_layers"])
    modules = dict(model.named_modules())
    trainable = {name for name, m in modules.items() if isinstance(m, CompactWeight) and m.trainable}
    if trainable != set(weights):
        raise ValueError(f"{folder} trains other weights than this model's layout marks trainable; resume the same run")
    for name, tensor in weights.items():
        if modules[name].stored.shape != tensor.shape:
            raise ValueError(f"{folder} holds {name} of shape {list(tensor.shape)}; the model's is different")
    for name, tensor in weights.items():
        modules[name].stored = nn.Parameter(tensor, requires_grad=False)
    return saved["optimizer"]
