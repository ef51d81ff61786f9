"""What a lean fine-tune changed, as one safetensors file, and how to put it back on its base model.

The file holds every trainable weight as it is stored (bf16 or fp32) under its name in the lean
model (`layers.3.self_attn.q_proj.parts.0.stored`), each split FFN's learner nodes
(`layers.3.mlp.down_proj.learners`), and in its metadata the base GGUF file's name and size, so
that it is applied only to the model it was trained from. Frozen weights are not in it: they are
the GGUF file's.

The file is written tensor by tensor straight from the model's storage (safetensors' own writer
first copies every tensor into a bytes object, which would add the whole file's size to the run's
peak: docs/llm.md, "Running one"), to a temporary name renamed into place when complete.

    >>> save_trained(model, "out/trained.safetensors", base=gguf_path)
    >>> model = load_lean_model(gguf_path)
    >>> load_trained(model, "out/trained.safetensors", base=gguf_path)   # the fine-tuned model again
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from far.atomic import atomic_file
from far.llm.compact import CompactWeight
from far.llm.lean_far import INPUTS, OUTPUT, ffn_names, split_ffns
from far.llm.lean_model import LeanCausalLM

FORMAT = "far-lean-trained/1"
LEARNERS = ".learners"
_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}


def _base_identity(base: Path) -> dict[str, str]:
    return {"base_file": base.name, "base_bytes": str(base.stat().st_size)}


def trained_tensors(model: LeanCausalLM) -> dict[str, Tensor]:
    """Every trainable weight by name, then each split FFN's learner nodes (sorted original indices)."""
    tensors = {
        f"{name}.stored": module.stored.detach()
        for name, module in model.named_modules()
        if isinstance(module, CompactWeight) and module.trainable
    }
    for name, layer in zip(ffn_names(model), model.layers, strict=True):
        if layer.mlp.learner_nodes is not None:
            tensors[name + LEARNERS] = layer.mlp.learner_nodes
    return tensors


def save_trained(model: LeanCausalLM, path: str | os.PathLike, base: str | os.PathLike) -> int:
    """Write what MeZO trains in `model` to `path` (atomically); returns the file's size in bytes.

    Raises:
        ValueError: nothing in the model is trainable.
    """
    tensors = trained_tensors(model)
    if not any(name.endswith(".stored") for name in tensors):
        raise ValueError("nothing in this model is trainable, so there is no fine-tune to save")
    header: dict[str, dict] = {"__metadata__": {"format": FORMAT, **_base_identity(Path(base))}}
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
    return Path(path).stat().st_size


def load_trained(model: LeanCausalLM, path: str | os.PathLike, base: str | os.PathLike) -> LeanCausalLM:
    """Apply a `save_trained` file to `model`, freshly loaded from `base`, in place.

    Splits the FFNs as they were split in training (when the file has learners), replaces each
    saved weight and marks exactly those trainable, so that MeZO can also go on from here. Every
    check runs before anything changes.

    Raises:
        ValueError: not such a file, trained from another base model, a model already split, or a
            weight the model does not have in that shape.
    """
    path, base = Path(path), Path(base)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        metadata, keys = f.metadata() or {}, list(f.keys())
        learners = {key.removesuffix(LEARNERS): f.get_tensor(key) for key in keys if key.endswith(LEARNERS)}
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in keys if not key.endswith(LEARNERS)}
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} is not a file of trained weights written by far's lean runtime (save_trained)")
    want, have = (metadata.get("base_file"), metadata.get("base_bytes")), tuple(_base_identity(base).values())
    if want != have:
        raise ValueError(
            f"{path} was trained from {want[0]} ({want[1]} bytes), not {have[0]} ({have[1]} bytes): "
            "load it onto the model it was trained from"
        )
    if learners and set(learners) != set(ffn_names(model)):
        raise ValueError(f"{path} has learners for {len(learners)} FFNs, this model has {len(model.layers)}")
    if learners and any(len(layer.mlp.down_proj.parts) != 1 for layer in model.layers):
        raise ValueError("this model's FFNs are already split; load the trained file onto a freshly loaded model")
    expected = _shapes_after_split(model, {name: nodes.numel() for name, nodes in learners.items()})
    for key, shape in shapes.items():
        if expected.get(key) != shape:
            raise ValueError(
                f"{path} holds {key} of shape {list(shape)}, which this model does not have "
                f"({'no such weight' if key not in expected else f'its shape is {list(expected[key])}'})"
            )
    if learners:  # the learner blocks are replaced below, so they are split off in the smaller dtype
        split_ffns(model, learners, torch.bfloat16)  # checks the indices before it changes anything
    modules = dict(model.named_modules())
    for weight in model.compact_weights():
        weight.trainable = False
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for key in shapes:
            weight = modules[key.removesuffix(".stored")]
            weight.stored = nn.Parameter(f.get_tensor(key), requires_grad=False)
            weight.trainable = True
    return model


def _shapes_after_split(model: LeanCausalLM, learners: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape, with the learner blocks FFNs split with `learners` nodes have."""
    shapes = {
        f"{name}.stored": tuple(module.stored.shape)
        for name, module in model.named_modules()
        if isinstance(module, CompactWeight)
    }
    hidden = model.config.hidden_size
    for name, n in learners.items():
        prefix = name.removesuffix(f".{OUTPUT}")
        for proj in (*INPUTS, OUTPUT):
            shapes[f"{prefix}.{proj}.parts.0.stored"] = (hidden, n) if proj == OUTPUT else (n, hidden)
    return shapes
