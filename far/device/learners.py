"""`to_learners`: a device training state back to far, as an ordinary learners file for the stock model.

The state's tensors already carry the learners file's names and layouts (an input projection's
`learner_weight` (k, in) and `learner_bias` (k,), the output projection's `learner_weight`
(out, k), nodes in ascending order; every other tensor under its own name). The stock model is
reconfigured with the manifest's learners and FAR config, the state is copied in, and
`far.save_learners` writes the file; `far.load_learners(stock_model, file)` then computes what
the device program computes.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from torch import nn

from far.config import FARConfig
from far.device.manifest import DeviceFileError, read_manifest
from far.device.state import read_state
from far.layers import OUTPUT, SplitLinear
from far.saving.fingerprint import base_fingerprint, outside_split
from far.saving.labels import set_head_fields
from far.saving.learners_file import save_learners
from far.surgery.reconfigure import reconfigure_with_learners
from far.surgery.state import is_reconfigured, node_groups


def _transposed(model: nn.Module, name: str) -> bool:
    """Whether the state keeps `name` transposed against the model: an output projection's learner columns."""
    module_name, _, part = name.rpartition(".")
    module = model.get_submodule(module_name)
    return isinstance(module, SplitLinear) and module.role == OUTPUT and part == "learner_weight"


def _shape(model: nn.Module, name: str, params: dict[str, nn.Parameter]) -> list[int] | None:
    if name not in params:
        return None
    shape = list(params[name].shape)
    return shape[::-1] if _transposed(model, name) else shape


@torch.no_grad()
def _copy_state(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    for name, value in tensors.items():
        module_name, _, part = name.rpartition(".")
        module = model.get_submodule(module_name)
        if isinstance(module, SplitLinear) and part in ("learner_weight", "learner_bias"):
            target = getattr(module, part)  # (k, f): one row per learner node, stored in node_order[:k]
            rows = value.t() if _transposed(model, name) else value
            perm = module.node_order[: module.n_learners].argsort()  # ascending node -> stored row
            target.index_copy_(0, perm, rows.to(target.device, target.dtype))
        else:
            model.get_parameter(name).copy_(value)


def to_learners(
    out_dir: str | os.PathLike,
    state_path: str | os.PathLike,
    stock_model: nn.Module,
    learners_path: str | os.PathLike,
) -> Path:
    """Write a device training state as a learners file for `stock_model` (which is left as it is).

    Args:
        out_dir: The export folder the state was trained with.
        state_path: Its state file (`far.device.train`'s, or the export's initial one).
        stock_model: The stock base model the export's base fingerprint belongs to, with a head
            of the program's size (e.g. `num_labels` as the manifest says).
        learners_path: The learners file to write, atomically.

    Returns:
        The path written.

    Raises:
        DeviceFileError: a damaged state file or one of another export; `stock_model` is not the
            export's base (its fingerprint differs) or is already reconfigured. Nothing is written then.

    Example:
        >>> far.device.to_learners("OUT", "OUT/state.safetensors", base, "user.safetensors")
        >>> far.load_learners(base, "user.safetensors")
    """
    manifest = read_manifest(out_dir, verify_programs=False)
    state = read_state(state_path, manifest)
    if is_reconfigured(stock_model):
        raise ValueError("pass the stock model (not reconfigured by FAR): the learners file is written for it")
    model = copy.deepcopy(stock_model)
    config = FARConfig(**manifest["far_config"])
    chosen = {name: torch.tensor(idx, dtype=torch.long) for name, idx in manifest["learners"].items()}
    groups = node_groups(model, attention=False)
    if set(groups) != set(chosen):
        raise DeviceFileError("the model's FFNs are not the export's; pass the stock model the export was made from")
    reconfigure_with_learners(model, chosen, config)
    trainable = set(state.tensors)
    params = dict(model.named_parameters())
    wrong = [f"{n} {list(t.shape)}" for n, t in state.tensors.items() if _shape(model, n, params) != list(t.shape)]
    if wrong:
        raise DeviceFileError(
            f"the stock model has no tensor of the state's shape for {wrong[:2]}: pass the export's base, with a "
            f"head of {manifest['task']['num_labels']} output(s)"
        )
    for name, param in params.items():
        param.requires_grad_(name in trainable)  # exactly what the device trained, as save_learners stores it
    others = outside_split(model, [n for n in params if n in trainable])
    if base_fingerprint(model, groups, chosen, others) != manifest["base_fingerprint"]:
        raise DeviceFileError(
            "the stock model is not the base this export was made from (base fingerprints differ); pass that model"
        )
    _copy_state(model, state.tensors)
    set_head_fields(model, manifest["head"])
    return save_learners(model, learners_path)
