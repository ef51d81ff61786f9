"""A whole model's weights as one safetensors file, split FFN layers included.

`safetensors.torch.save_model` refuses two tensors that are parts of one storage unless one covers it
all; a `SplitLinear`'s learner and frozen weights are exactly that, and copying them apart would cost a
copy of every FFN weight per save. Disjoint views are written as they are; only the very same memory under
two names (tied weights) is written once, the metadata saying which name stands for which.
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
