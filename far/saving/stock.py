"""A model's stock weights read back from the folder it was loaded from, one tensor when asked.

`far.Primer(reference=...)` and `far.finetune(base_weights=...)` take such a reader, so priming keeps no
copy of the FFNs (MiniLM 28 MB, BERT-base 226 MB). Each read opens the file, copies one tensor and closes
it, so no page of the file stays mapped.

    >>> reader = stock_reader("runs/base-model", model)
    >>> torch.equal(reader("bert.encoder.layer.0.output.dense.weight"), model.bert.encoder.layer[0].output.dense.weight)
    True
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open
from torch import Tensor, nn

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a Hugging Face folder (one file, or the shards of an index)."""
    index = folder / WEIGHTS_INDEX_NAME
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / shard for shard in shards]
    single = folder / WEIGHTS_NAME
    return [single] if single.is_file() else []


def stock_reader(folder: str | os.PathLike, model: nn.Module) -> Callable[[str], Tensor] | None:
    """`read(parameter_name)` -> that parameter's tensor in `folder`'s safetensors files, or None without any.

    A parameter is found under its own name, or without (or with) the model's base prefix (`bert.`); a name
    the files do not hold, or hold in another shape, raises KeyError.
    """
    files = weight_files(Path(folder))
    if not files:
        return None
    where: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                where[key] = (file, key, tuple(f.get_slice(key).get_shape()))
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    located: dict[str, tuple[Path, str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        for key in (name, name.removeprefix(prefix), prefix + name):
            # A tensor held in another shape is not this parameter's stock value (a head made anew at load time
            # for another number of labels): not located, as a head the files do not hold.
            if key in where and where[key][2] == tuple(parameter.shape):
                located[name] = where[key][:2]
                break

    def read(name: str) -> Tensor:
        if name not in located:
            raise KeyError(f"{name} is not in the model files of {str(folder)!r}")
        file, key = located[name]
        with safe_open(file, framework="pt") as f:
            return f.get_tensor(key)

    return read
