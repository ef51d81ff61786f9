"""`lm_to_learners`: a causal LM export's training state back to far, as the learners file of its stock GGUF.

The state's tensors carry the lean model's names (`layers.2.mlp.gate_proj.parts.0.stored`: a split
FFN's learner block; `layers.2.input_layernorm.stored`: a whole weight). A copy of the stock model
is split with the manifest's learners and given the export's trainable set
(`far.llm.lean_far.split_ffns`, `set_trainable` above `frozen_layers`), the state is copied in by
name, and `far.llm.lean_saving.save_trained` writes the file that `far generate --learners FILE`
and `far.load_learners` apply to the stock model.

    >>> stock = far.models.load_lean_lm("smollm2-135m")[0]
    >>> lm_to_learners("OUT", "user.safetensors", stock, "notes-learners.safetensors")
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from far.device.manifest import NEXT_TOKEN, DeviceFileError, read_manifest
from far.device.state import read_state
from far.llm.lean_far import ffn_names, set_trainable, split_ffns
from far.llm.lean_learners import check_stock
from far.llm.lean_model import LeanCausalLM
from far.llm.lean_saving import save_trained


def _weights(model: LeanCausalLM) -> dict:
    """`{state name: CompactWeight}` of every weight in `model`, named as the export names its tensors."""
    return {f"{name}.stored": module for name, module in model.named_modules() if hasattr(module, "stored")}


@torch.no_grad()
def lm_to_learners(
    out_dir: str | os.PathLike,
    state_path: str | os.PathLike,
    stock_model: LeanCausalLM,
    learners_path: str | os.PathLike,
    values_dtype: torch.dtype | None = None,
) -> Path:
    """Write a causal LM export's training state as a learners file for its stock GGUF model.

    Args:
        out_dir: The export folder (`far.device.export_causal_lm`) the state was trained with.
        state_path: Its state file: the runner's (`far_train`), `far.device.train`'s, or the export's initial one.
        stock_model: The stock lean model of the export's GGUF file (`far.models.load_lean_lm`); left as it is.
        learners_path: The learners file to write, atomically.
        values_dtype: Keep the trained values in this dtype (e.g. torch.bfloat16: a byte a value, as
            `far train` keeps them); None keeps the device's float32 values exactly.

    Returns:
        The path written.

    Raises:
        DeviceFileError: a damaged state or one of another export; `stock_model` is not the export's GGUF
            model. Nothing is written then.
    """
    manifest = read_manifest(out_dir, verify_programs=False, objective=NEXT_TOKEN)
    state = read_state(state_path, manifest)
    check_stock(stock_model)
    if stock_model.source.sha256() != manifest["base"]["sha256"]:
        raise DeviceFileError(
            f"the stock model was read from {stock_model.source.path.name}, not the export's base "
            f"{manifest['base']['gguf']}; load that GGUF file"
        )
    model = copy.deepcopy(stock_model)
    learners = {name: torch.tensor(manifest["learners"][name], dtype=torch.long) for name in ffn_names(model)}
    split_ffns(model, learners, torch.float32)
    set_trainable(model, "learners", torch.float32, frozen_layers=int(manifest["frozen_layers"]))
    weights = _weights(model)
    trained = {name for name, weight in weights.items() if weight.trainable}
    if trained != set(state.tensors):
        raise DeviceFileError(
            f"the stock model, laid out as the export says, trains {sorted(trained ^ set(state.tensors))[:3]} "
            "differently from the state; pass the state of this export"
        )
    for name, value in state.tensors.items():
        stored = weights[name].stored
        if stored.shape != value.shape:
            raise DeviceFileError(f"{name} is {list(value.shape)} in the state, {list(stored.shape)} in the model")
        stored.copy_(value)
    save_trained(model, learners_path, base=stock_model.source.path, values_dtype=values_dtype)
    return Path(learners_path)
