"""What a lean fine-tune changed, as a learners file for its GGUF base (`far.llm.lean_learners`), and how
to train on from one.

`far.load_learners(model, path)` applies a file to the stock model for inference; `load_trained` puts
a fine-tune back as it was trained (FFNs split, the same weights trainable), so that MeZO can go on.
The file is written tensor by tensor from memory: safetensors' own writer first copies every tensor
into a bytes object, adding the file's size to the run's peak.

    >>> save_trained(model, "out/learners.safetensors", base=gguf_path)
    >>> model = load_lean_model(gguf_path)
    >>> load_trained(model, "out/learners.safetensors", base=gguf_path)   # the fine-tuned model again
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from torch import Tensor, nn

from far.llm.compact import CompactLinear, CompactWeight
from far.llm.gguf_file import read_weights
from far.llm.gguf_source import GGUFSource
from far.llm.lean_far import ffn_names, ffn_of, split_ffns
from far.llm.lean_learners import (
    DELTA8,
    FORMAT,
    FORMAT_VERSION,
    INDICES,
    LEARNERS,
    Slot,
    check_stock,
    config_record,
    decode,
    encode,
    plan,
    read_file,
    value_key,
)
from far.llm.lean_model import LeanCausalLM
from far.saving.safetensors_file import content_sha256
from far.storage.atomic import atomic_file

_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int8: "I8"}


def trained_slots(model: LeanCausalLM) -> list[Slot]:
    """Every trained value: a split FFN's learner block at its nodes, any other weight whole (ValueError if
    a frozen block is trainable).
    """
    modules = dict(model.named_modules())
    slots = []
    for name, weight in modules.items():
        if not (isinstance(weight, CompactWeight) and weight.trainable):
            continue
        parent, _, part = name.rpartition(".parts.")
        linear = modules.get(parent)
        if not (isinstance(linear, CompactLinear) and len(linear.parts) == 2):
            slots.append(Slot(value_key(name), weight))
        elif part == "0":
            nodes = modules[parent.rpartition(".")[0]].learner_nodes
            slots.append(Slot(parent + LEARNERS, weight, linear.node_dim, nodes))
        else:
            raise ValueError(f"{name}, the frozen nodes of a split FFN, is trainable; only its learners can be saved")
    return slots


def _stock(read, slot: Slot) -> Tensor:
    """The stock GGUF value (fp32) of what `slot` holds."""
    if slot.nodes is None:
        return read(f"model.{slot.key}")
    return read(f"model.{slot.key.removesuffix(LEARNERS)}.weight").index_select(slot.node_dim, slot.nodes)


@torch.no_grad()
def save_trained(
    model: LeanCausalLM,
    path: str | os.PathLike,
    base: str | os.PathLike,
    values_dtype: torch.dtype | None = None,
) -> int:
    """Write what training changed in `model` as a learners file for the GGUF file `base`, atomically.

    Args:
        model: A lean model read from `base` and trained (some weights trainable, FFNs split or not).
        path: Where to write, e.g. `"alice.safetensors"`.
        base: The GGUF file the model was read from: the file records its sha256.
        values_dtype: Keep the trained values in this dtype (rounded to nearest), e.g. bfloat16 for weights
            trained in float32: one byte a value as a difference from the stock bf16 value where float32 takes
            four, and a file any base loaded in bf16 applies. None: the dtype they were trained in.

    Returns:
        The file's size in bytes.

    Raises:
        ValueError: nothing in the model is trainable, or `base` holds a model of another shape.
    """
    slots = trained_slots(model)
    if not slots:
        raise ValueError("nothing in this model is trainable, so there is no fine-tune to save")
    base = Path(base)
    tensors: dict[str, Tensor] = {}
    values: dict[str, dict[str, str]] = {}
    with read_weights(base) as (config, read):
        if config != model.config:
            raise ValueError(f"{base} holds a model of another shape than this one: pass the GGUF file it came from")
        for slot in slots:  # one stock tensor in memory at a time
            value = slot.weight.stored if values_dtype is None else slot.weight.stored.to(values_dtype)
            encoding, parts = encode(value, _stock(read, slot))
            values[slot.key] = {"encoding": encoding, "dtype": str(value.dtype).removeprefix("torch.")}
            tensors.update({slot.key + suffix: tensor for suffix, tensor in parts.items()})
            if slot.nodes is not None:
                tensors[ffn_of(slot.key) + INDICES] = slot.nodes.to(torch.int64).contiguous()
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "base_file": base.name,
        "base_bytes": str(base.stat().st_size),
        "base_sha256": GGUFSource.of(base).sha256(),
        "lean_config": json.dumps(config_record(model)),
        "values": json.dumps(values),
    }
    metadata["content_sha256"] = content_sha256(metadata, tensors.items())
    _write(path, metadata, tensors)
    return Path(path).stat().st_size


@torch.no_grad()
def round_trained(model: LeanCausalLM, dtype: torch.dtype) -> None:
    """Round every trained weight to `dtype`'s values in place, so the model scores what
    `save_trained(..., values_dtype=dtype)` keeps.
    """
    for weight in model.trainable_weights():
        weight.stored.copy_(weight.stored.to(dtype))


def _write(path: str | os.PathLike, metadata: dict[str, str], tensors: dict[str, Tensor]) -> None:
    """A safetensors file, tensor by tensor from memory, atomically."""
    header: dict[str, dict] = {"__metadata__": metadata}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)}
        header[name]["data_offsets"] = [offset, offset + size]
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to a multiple of 8 bytes
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for tensor in tensors.values():
            f.write(memoryview(tensor.contiguous().view(torch.uint8).numpy()))


@torch.no_grad()
def load_trained(model: LeanCausalLM, path: str | os.PathLike, base: str | os.PathLike) -> LeanCausalLM:
    """Put a `save_trained` fine-tune back on `model`, freshly read from `base`, as it was trained, in place.

    FFNs split as in training, each saved weight written in its trained dtype and exactly those trainable,
    so that MeZO can go on. Every check runs before anything changes.

    Raises:
        ValueError: `model` was not read from `base`, is not the stock model, or the file does not fit it
            (`far.llm.lean_learners.LeanLearnersFileError`).
    """
    check_stock(model)
    if GGUFSource.of(base).sha256() != model.source.sha256():
        raise ValueError(f"this model was not read from {base}; load it with load_lean_model(base) first")
    metadata, tensors = read_file(path)
    planned = plan(model, path, metadata, tensors, retype=True)
    learners = {slot.key: slot.nodes for slot, _, _ in planned if slot.nodes is not None}
    dtypes = {torch.bfloat16 if e == DELTA8 else parts[""].dtype for s, e, parts in planned if s.nodes is not None}
    if len(dtypes) > 1:
        raise ValueError(f"{path} holds learners in several dtypes ({sorted(map(str, dtypes))}); save it again")
    if learners:  # every FFN split, as `prime_and_split` left them: empty where a layer had no learners
        by_ffn = {ffn_of(key): nodes for key, nodes in learners.items()}
        empty = torch.empty(0, dtype=torch.int64)
        split_ffns(model, {name: by_ffn.get(name, empty) for name in ffn_names(model)}, dtypes.pop())
    modules = dict(model.named_modules())
    for weight in model.compact_weights():
        weight.trainable = False
    for slot, encoding, parts in planned:
        if slot.nodes is not None:  # now the learner block itself, its rows in the file's (sorted) order
            slot = Slot(slot.key, modules[slot.key.removesuffix(LEARNERS)].parts[0])
        value = decode(encoding, parts, slot.read())
        if value.dtype == slot.weight.stored.dtype:
            slot.write(value)
        else:  # trained in another dtype than the base stores (e.g. fp32): kept in it, as in training
            slot.weight.stored = nn.Parameter(value.clone(), requires_grad=False)
        slot.weight.trainable = True
    return model
