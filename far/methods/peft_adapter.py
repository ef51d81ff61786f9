"""A FAR user's learners file as an exact PEFT LoRA adapter, for the tools that serve LoRA adapters.

FAR changes an FFN's input projection only in its k learner rows and its output projection only in its
k learner columns, so each change is exactly a rank-k product, with no approximation:

    input projection  (out, in):  W' - W = E_rows @ D          E_rows (out, k) one-hot, D (k, in) the rows' change
    output projection (out, in):  W' - W = D @ E_cols.T        D (out, k) the columns' change, E_cols (in, k) one-hot

which is LoRA's `B @ A` with `r = k` and `lora_alpha = r` (scale 1): B = E_rows, A = D for an input projection,
B = D, A = E_cols.T for an output one. A changed bias rides on `lora_B`'s bias (PEFT's `lora_bias`). What FAR
trains whole (attention above the frozen depth, LayerNorms, the task head) is not low-rank, and goes into the
adapter as `modules_to_save`, PEFT's place for modules trained in full. The adapter is built and written by
PEFT itself (`get_peft_model`, `save_pretrained`), so its files are exactly what PEFT reads.

    >>> base, _ = load_model_and_tokenizer("minilm", "classification", num_labels=2)
    >>> save_peft_adapter(base, "alice.safetensors", "alice-lora/")
    >>> model = peft.PeftModel.from_pretrained(base, "alice-lora/")   # far.load_learners' logits
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

import far
from far.layers import INPUT, SplitLinear
from far.methods.lora import _peft
from far.storage.atomic import atomic_dir


@dataclass
class Adapter:
    """What an adapter holds: low-rank factors per module, and the modules saved whole."""

    factors: dict[str, tuple[Tensor, Tensor, Tensor | None]] = field(default_factory=dict)  # name -> (A, B, bias)
    whole: list[str] = field(default_factory=list)


def _one_hot(indices: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    out = torch.zeros(n, len(indices), dtype=dtype)
    out[indices, torch.arange(len(indices))] = 1
    return out


def _factors(
    name: str, role: str, nodes: Tensor, before: nn.Linear, after: nn.Linear
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(A, B, bias change or None), B @ A == after.weight - before.weight exactly; refuses a change off the nodes."""
    change = (after.weight - before.weight).detach().float()  # (out, in)
    off = change.clone()
    if role == INPUT:  # nodes are rows: (k, in) and (out, k)
        a, b = change[nodes], _one_hot(nodes, change.shape[0], torch.float32)
        off[nodes] = 0
    else:  # nodes are columns: (k, in) and (out, k)
        a, b = _one_hot(nodes, change.shape[1], torch.float32).t(), change[:, nodes]
        off[:, nodes] = 0
    if off.abs().max() > 0:
        raise ValueError(f"{name} changed outside its learner nodes, which a rank-{len(nodes)} LoRA cannot hold")
    bias = None
    if before.bias is not None and not torch.equal(after.bias, before.bias):
        bias = (after.bias - before.bias).detach()
    dtype = before.weight.dtype
    return a.to(dtype).contiguous(), b.to(dtype).contiguous(), bias


def compare(base: nn.Module, tuned: nn.Module, splits: dict[str, tuple[str, Tensor]]) -> Adapter:
    """Compare the stock model with the user's (merged): factors for the split projections, whole modules else.

    Args:
        base: The stock model.
        tuned: The user's model, merged: the same module names and shapes as `base`.
        splits: Each split projection's name -> (role, its learner nodes' original indices, ascending).

    Raises:
        ValueError: a split projection that is no nn.Linear, or changed outside its learner nodes.
    """
    stock = dict(base.named_modules())
    adapter = Adapter()
    for name, module in tuned.named_modules():
        if name in splits:
            role, nodes = splits[name]
            if not isinstance(stock[name], nn.Linear):
                raise ValueError(f"{name} is a {type(stock[name]).__name__}; PEFT adapters are exported for nn.Linear")
            if len(nodes):
                adapter.factors[name] = _factors(name, role, nodes, stock[name], module)
            continue
        reference = dict(stock[name].named_parameters(recurse=False))
        if any(not torch.equal(p, reference[key]) for key, p in module.named_parameters(recurse=False)):
            adapter.whole.append(name)
    return adapter


def _config(adapter: Adapter) -> object:
    """PEFT's LoraConfig for `adapter`: r and alpha per module its learner count, the rest saved whole."""
    peft = _peft()
    ranks = {re.escape(name): a.shape[0] for name, (a, _, _) in adapter.factors.items()}
    top = max(ranks.values(), default=1)
    return peft.LoraConfig(
        r=top,
        lora_alpha=top,
        rank_pattern=ranks,
        alpha_pattern=dict(ranks),  # alpha = r per module: LoRA's scale is 1
        # a string is a regex PEFT matches whole against each module's name (a list would match name suffixes)
        target_modules="|".join(re.escape(name) for name in adapter.factors) or None,
        modules_to_save=adapter.whole or None,
        lora_dropout=0.0,
        lora_bias=any(bias is not None for _, _, bias in adapter.factors.values()),
        init_lora_weights=False,
    )


def save_peft_adapter(
    base: nn.Module, learners_file: str | os.PathLike, output_dir: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Write a learners file as a PEFT LoRA adapter folder for `base`, the stock model it was trained from.

    Args:
        base: The plain stock model (an encoder with its head, as `far.load_learners` takes it); not changed.
        learners_file: A user's learners file (`far.save_learners`).
        output_dir: The adapter folder to write (`adapter_config.json`, `adapter_model.safetensors`), atomically.
        overwrite: Replace an `output_dir` that holds files.

    Returns:
        The folder. `peft.PeftModel.from_pretrained(base, output_dir)` then gives `far.load_learners`' logits.

    Raises:
        ValueError: `output_dir` holds files (without `overwrite`), `base` is reconfigured, or the file changed
            something a LoRA adapter cannot hold; `far.saving.LearnersFileError` for a file of another base.
    """
    out = Path(output_dir)
    check_output_dir(out, overwrite)
    if far.is_reconfigured(base):
        raise ValueError("base is reconfigured; pass the plain stock model the learners file was trained from")
    tuned = far.load_learners(copy.deepcopy(base), learners_file)
    splits = {
        name: (m.role, m.learner_indices().sort().values)
        for name, m in tuned.named_modules()
        if isinstance(m, SplitLinear)
    }
    far.restore(tuned)  # the user's model, merged: the same module names and shapes as the base
    return write_adapter(copy.deepcopy(base), tuned, compare(base, tuned, splits), out)


def check_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse an output folder that holds files (unless `overwrite`), or a file in its place."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"{str(out)!r} already holds files; name a new folder, or pass overwrite=True")


def write_adapter(
    model: nn.Module, tuned: nn.Module, adapter: Adapter, output_dir: Path, files: dict[str, str] | None = None
) -> Path:
    """Wrap `model` (a stock model this call may change) with PEFT's LoRA for `adapter`, and write it atomically.

    Args:
        model: The stock model, wrapped in place by `peft.get_peft_model`: pass a copy of one still needed.
        tuned: The user's model, merged, from which the modules saved whole are taken.
        adapter: `compare(base, tuned, splits)`.
        output_dir: The adapter folder (`adapter_config.json`, `adapter_model.safetensors`).
        files: More text files to write into the folder, by name.

    Returns:
        The folder.
    """
    model = _peft().get_peft_model(model, _config(adapter))
    with torch.no_grad():
        for name, (a, b, bias) in adapter.factors.items():
            layer = model.base_model.model.get_submodule(name)
            layer.lora_A["default"].weight.copy_(a)
            layer.lora_B["default"].weight.copy_(b)
            if layer.lora_B["default"].bias is not None:
                layer.lora_B["default"].bias.copy_(bias if bias is not None else 0)
        for name in adapter.whole:
            wrapper = model.base_model.model.get_submodule(name)
            wrapper.modules_to_save["default"].load_state_dict(tuned.get_submodule(name).state_dict())
    with atomic_dir(output_dir) as tmp, warnings.catch_warnings():
        # PEFT takes every 1-D LoRA tensor for an ungathered FSDP shard; lora_B's bias is 1-D by design
        warnings.filterwarnings("ignore", message=r".*LoRA tensor\(s\) have invalid shape")
        model.save_pretrained(tmp)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
    return output_dir
