"""A whole model's weights as one safetensors file, split FFN layers included.

`safetensors.torch.save_model` refuses a state dict in which two tensors are parts of one storage
unless one of them covers it all; a `SplitLinear`'s learner and frozen weights are exactly that
(two disjoint views of one contiguous tensor), and copying them apart would cost a copy of every
FFN weight on each save. Disjoint views are written as they are (`save_file` accepts them); only
tensors that are the very same memory under two names (tied weights, e.g. an LM head tied to the
embeddings) are written once, and the file's metadata says which name stands for which.
"""

from __future__ import annotations

import json
import os

from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

_ALIASES_KEY = "far.aliases"


def save_model_file(model: nn.Module, path: str | os.PathLike) -> None:
    """Write `model.state_dict()` to `path`, tied tensors once (`load_model_file` reads it back)."""
    tensors, aliases, seen = {}, {}, {}
    for name, tensor in model.state_dict().items():
        identity = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        # Empty tensors (the learner blocks of layers frozen whole) all have data_ptr 0: never ties.
        if identity in seen and tensor.numel():
            aliases[name] = seen[identity]
            continue
        seen[identity] = name
        tensors[name] = tensor if tensor.is_contiguous() else tensor.contiguous()
    save_file(tensors, str(path), metadata={_ALIASES_KEY: json.dumps(aliases)})


def load_model_file(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> None:
    """Copy the weights of a `save_model_file` file into `model`, in place (its storages are kept)."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        aliases = json.loads((f.metadata() or {}).get(_ALIASES_KEY, "{}"))
        state = {key: f.get_tensor(key) for key in f.keys()}
    state.update({name: state[target] for name, target in aliases.items()})
    model.load_state_dict(state, strict=strict)
