"""A GGUF causal LM's learners file as an exact PEFT LoRA adapter, for its base as a transformers model.

A lean learners file (`far.llm.lean_learners`) changes an FFN's gate and up projections only in its k learner
rows and its down projection only in its k learner columns: exactly a rank-k product each, written as LoRA
factors as for an encoder (`far.methods.peft_adapter`: r = k, lora_alpha = r). Every other weight the run
trained (attention matrices, RMSNorms, the final norm) is a module's weight, saved whole as `modules_to_save`;
the token embedding (the tied head) is never trained.

The adapter's base is the lean model's own stock weights as a transformers `LlamaForCausalLM` or
`Gemma3ForCausalLM` (`far.methods.lean_hf.save_hf_base`): the dequantised GGUF weights as the lean model stores
them (in bf16 for a bf16 learners file), not a float32 dequantisation, whose matrices differ by bf16's rounding.

    >>> model, _ = far.models.load_lean_lm("smollm2-135m")
    >>> save_hf_base(model, "smollm2-hf/")                       # once per base
    >>> save_lean_peft_adapter(model, "alice.safetensors", "alice-lora/", base_dir="smollm2-hf/")
    >>> base = transformers.AutoModelForCausalLM.from_pretrained("smollm2-hf/")
    >>> peft.PeftModel.from_pretrained(base, "alice-lora/")      # far.load_learners' logits
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import Tensor

import far
from far.layers import INPUT, OUTPUT
from far.llm.lean_learners import LEARNERS, active_lean_learners, check_stock, plan, read_file
from far.llm.lean_model import LeanCausalLM
from far.methods.lean_hf import (
    BASE_RECORD,
    base_record,
    check_stock_base,
    hf_model,
    hf_state_dict,
    hf_value,
    read_base_record,
)
from far.methods.peft_adapter import check_output_dir, compare, write_adapter


def _user_state(
    model: LeanCausalLM, learners_file: str | os.PathLike, stock: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, tuple[str, Tensor]]]:
    """The user's weights (stock's tensors where the file changes nothing) and each split projection's nodes.

    The file is applied to `model` (every check first: a file of another base changes nothing) and taken off again.
    """
    far.load_learners(model, learners_file)
    try:
        state, splits = dict(stock), {}
        for slot, _ in active_lean_learners(model).base:
            name = f"model.{slot.key}"
            if slot.nodes is not None:  # layers.3.mlp.up_proj.learner_weight: its rows (gate, up) or columns (down)
                name = f"model.{slot.key.removesuffix(LEARNERS)}"
                splits[name] = (INPUT if slot.node_dim == 0 else OUTPUT, slot.nodes)
                name += ".weight"
            state[name] = hf_value(slot.weight)
    finally:
        far.unload_learners(model)  # the stock model again, bit for bit
    return state, splits


def user_hf_model(model: LeanCausalLM, learners_file: str | os.PathLike):
    """The user's model as a transformers causal LM: `model`'s stock weights with `learners_file` applied, merged,
    fp32 (as `far.load_learners` gives it; `.double()` for a float64 reference of it); `model` is left as it was.

    It is the function an adapter of `save_lean_peft_adapter` computes, and `merge_and_unload` gives its weights.
    """
    state, _ = _user_state(model, learners_file, hf_state_dict(model))
    return hf_model(model.config, state)


def check_learners_file(model: LeanCausalLM, learners_file: str | os.PathLike) -> None:
    """Raise as `far.load_learners` would, unless `learners_file` applies to `model`; changes nothing."""
    check_stock(model)
    metadata, tensors = read_file(learners_file)
    plan(model, learners_file, metadata, tensors)


def check_base_dir(base_dir: str | os.PathLike, model: LeanCausalLM) -> None:
    """Refuse a base folder that `save_hf_base` did not write from `model`'s weights (another GGUF file or dtype)."""
    record, found = base_record(model), read_base_record(base_dir)
    if found is None:
        raise ValueError(
            f"{str(base_dir)!r} holds no {BASE_RECORD}: name a folder that far.methods.lean_hf.save_hf_base (far "
            "export --base-out DIR) wrote for this model, or a new folder to write it into"
        )
    if found != record:
        raise ValueError(
            f"{str(base_dir)!r} holds the base of {found.get('gguf_file')} in {found.get('storage_dtype')}, not this "
            f"model's {record['gguf_file']} in {record['storage_dtype']}; name another base folder"
        )


def save_lean_peft_adapter(
    model: LeanCausalLM,
    learners_file: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    base_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a GGUF causal LM's learners file as a PEFT LoRA adapter folder for the model's transformers base.

    Args:
        model: The stock lean model the file was trained from (`far.models.load_lean_lm(name)`, in the dtype the
            file needs: `far.llm.lean_learners.values_dtype`); left as it was.
        learners_file: A user's lean learners file (`far train --model smollm2-135m ...`, `save_trained`).
        output_dir: The adapter folder to write (`adapter_config.json`, `adapter_model.safetensors`, and
            `far_base.json`: which GGUF file and storage dtype its base holds), atomically.
        base_dir: The base folder `far.methods.lean_hf.save_hf_base` wrote for this model: checked to hold these
            weights, and named as the adapter's `base_model_name_or_path` (PEFT's `AutoPeftModelForCausalLM`
            loads it from there).
        overwrite: Replace an `output_dir` that holds files.

    Returns:
        The folder. `peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), output_dir)`
        then gives the logits of `far.load_learners(model, learners_file)` (fp32 compute on both sides).

    Raises:
        ValueError: `output_dir` holds files (without `overwrite`), `model` is not a stock lean model read from a
            GGUF file, or `base_dir` holds another base; `LeanLearnersFileError` (a ValueError) for a file of
            another base, a damaged one, or one whose values the model's dtype cannot hold. Nothing is written then.
    """
    out = Path(output_dir)
    check_output_dir(out, overwrite)
    check_stock_base(model)
    record = base_record(model)
    if base_dir is not None:
        check_base_dir(base_dir, model)
    stock = hf_state_dict(model)
    state, splits = _user_state(model, learners_file, stock)
    base, tuned = hf_model(model.config, stock), hf_model(model.config, state)
    adapter = compare(base, tuned, splits)
    # PEFT records the model's name_or_path as the adapter's base_model_name_or_path (and looks a name that is not a
    # folder up on the Hub: without a base folder it stays empty; far_base.json says which base the adapter is for)
    base.name_or_path = str(Path(base_dir).resolve()) if base_dir is not None else ""
    return write_adapter(base, tuned, adapter, out, {BASE_RECORD: json.dumps(record, indent=2) + "\n"})
