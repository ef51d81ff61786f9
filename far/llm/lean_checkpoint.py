"""Checkpoints of a lean causal-LM fine-tune: written whole or not at all, resumed to the same weights.

Layout under `output_dir/checkpoints/`::

    step-<N>/state.pt            trained weights (as stored), learner nodes, optimizer state (torch.save)
    step-<N>/trainer_state.json  step, the trained layout (frozen layers, dtype), evaluations and seconds so far
    step-<N>/manifest.json       size and sha256 of the two files above
    latest                       the name of the newest complete step folder

Only what training changes is kept: the GGUF file holds the rest. torch.save writes each tensor's
storage as it is, adding no copy of the weights to the run's peak. Folders follow
`far.storage.step_folders`: whole or absent, a damaged one passed over for the one before.

    >>> save_lean_checkpoint(out, 40, model, optimizer_state, {"epoch": 1}, keep=2)
    >>> step, state = read_lean_checkpoint(out)        # the newest intact one
    >>> restore_trained(model, state)                  # onto a freshly loaded model
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from far.llm.compact import CompactWeight
from far.llm.lean_far import ffn_names, set_trainable, split_ffns
from far.llm.lean_model import LeanCausalLM
from far.storage.step_folders import CHECKPOINTS, manifest_problem, newest_intact, write_step_folder

STATE_FILE, TRAINER_FILE = "state.pt", "trainer_state.json"
FORMAT = "far-lean-lm-checkpoint/1"


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

    def write(folder: Path) -> None:
        torch.save({**trained_state(model), "optimizer": optimizer_state}, folder / STATE_FILE)
        (folder / TRAINER_FILE).write_text(json.dumps({**trainer_state, "step": step, "format": FORMAT}, indent=1))

    return write_step_folder(output_dir, step, write, keep)


def read_lean_checkpoint(output_dir: str | Path) -> tuple[Path, dict]:
    """The newest intact checkpoint (folder, trainer state); damaged ones are skipped with a warning."""
    root = Path(output_dir) / CHECKPOINTS
    folder, problems = newest_intact(root, lambda f: manifest_problem(f, required=True))
    if folder is None:
        detail = f": {'; '.join(problems)}" if problems else ""
        raise ValueError(f"no intact checkpoint under {root}{detail}; start the run again without --resume")
    state = json.loads((folder / TRAINER_FILE).read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{folder} is not a checkpoint of a lean causal-LM run ({FORMAT})")
    return folder, state


def restore_trained(model: LeanCausalLM, folder: Path, state: dict, dtype: torch.dtype) -> dict | None:
    """Put a checkpoint's layout and weights onto `model`, freshly loaded from the same GGUF file; returns the
    optimizer state. Every saved weight's name and shape is checked before any is loaded (ValueError).
    """
    # Mapped, not read: the file's pages come in as each tensor is used, and AdamW's moments, written in place,
    # become the process's own pages only then.
    saved = torch.load(folder / STATE_FILE, weights_only=True, mmap=True)
    learners, weights = saved["learners"], saved["weights"]
    if learners and set(learners) != set(ffn_names(model)):
        raise ValueError(f"{folder} has learners for {len(learners)} FFNs, this model has {len(model.layers)}")
    if learners:
        split_ffns(model, learners, dtype)
    modules = dict(model.named_modules())
    for name, tensor in weights.items():
        module = modules.get(name)
        if not isinstance(module, CompactWeight) or module.stored.shape != tensor.shape:
            shape = "no such weight" if module is None else f"its shape is {list(module.stored.shape)}"
            raise ValueError(f"{folder} holds {name} of shape {list(tensor.shape)}; the model's: {shape}")
    # The saved weights go in before the layout is marked, so that marking converts none of them to a copy in the
    # trained dtype that the saved one would replace at once (a resumed run's peak would hold both).
    for name, tensor in weights.items():
        modules[name].stored = nn.Parameter(tensor, requires_grad=False)
    set_trainable(model, state["ffn"], dtype, frozen_layers=state["frozen_layers"])
    trainable = {name for name, m in modules.items() if isinstance(m, CompactWeight) and m.trainable}
    if trainable != set(weights):
        raise ValueError(f"{folder} trains other weights than this model's layout marks trainable; resume the same run")
    return saved["optimizer"]
