"""The training state file: the trainable tensors, the optimizer's state, and where in the data training is.

One safetensors file (written atomically, so a kill leaves the previous one whole):

- `<name>` float32: each trainable tensor, named and shaped as the manifest's `trainable` list;
- `<slot>:<name>` float32: its optimizer state, present once a step was taken: slot `momentum` for
  SGD with momentum, `exp_avg` and `exp_avg_sq` for AdamW (`far.device.optim.SLOTS`);
- metadata (strings): `format` ("far.device.state"), `format_version` ("1"), `base_fingerprint` and
  `program_sha256` (the base model and training program it belongs to), `step` (optimizer steps
  taken), `epoch` and `batch` (the next batch: batch `batch` of epoch `epoch`), `order_seed`,
  `examples_sha256` (the examples file trained on; empty before training) and `content_sha256`.

`content_sha256` is the sha256 of `b"far.device.state/1\\n"`, then for each metadata entry but
itself, keys in byte order, `meta\\0<key>\\0<value>\\n`, then for each tensor, names in byte order,
`tensor\\0<name>\\0<dtype>\\0<d0,d1,...>\\n` and its raw bytes (little-endian, row-major): a
flipped byte anywhere is caught before the file is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from far.device.manifest import DeviceFileError, program_sha256, read_safetensors
from far.device.optim import SLOTS
from far.saving.digests import hash_tensors
from far.storage.atomic import atomic_file

FORMAT, FORMAT_VERSION = "far.device.state", "1"
_PREFIX = b"far.device.state/1\n"
_CONTENT = "content_sha256"


@dataclass
class DeviceState:
    """Where a device training run stands.

    Attributes:
        tensors: `{name: value}` of every trainable tensor, in the manifest's order.
        slots: `{slot: {name: tensor}}`, the optimizer's state; empty before the first step.
        step: Optimizer steps taken.
        epoch, batch: The next batch to train on: batch `batch` of epoch `epoch` (0-based).
        order_seed: The seed of the batch order (`far.device.order`).
        examples_sha256: The sha256 of the examples file trained on ("" before the first step).
    """

    tensors: dict[str, Tensor]
    slots: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    step: int = 0
    epoch: int = 0
    batch: int = 0
    order_seed: int = 0
    examples_sha256: str = ""

    @property
    def momentum(self) -> dict[str, Tensor]:
        """SGD's momentum buffers (empty for AdamW, or before the first step)."""
        return self.slots.get("momentum", {})


def content_sha256(metadata: Mapping[str, str], tensors: Mapping[str, Tensor]) -> str:
    """The state file's content hash (defined in the module docstring)."""
    meta = b"".join(f"meta\0{key}\0{metadata[key]}\n".encode() for key in sorted(k for k in metadata if k != _CONTENT))
    return hash_tensors(tensors.items(), _PREFIX + meta, _state_header)


def _state_header(name: str, dtype: str, shape: list[int]) -> bytes:
    return f"tensor\0{name}\0{dtype}\0{','.join(str(d) for d in shape)}\n".encode()


def trainable_sha256(tensors: Mapping[str, Tensor]) -> str:
    """A digest of trainable values alone (the manifest's initial values, to know a state at its start)."""
    return content_sha256({}, tensors)


def write_state(path: str | os.PathLike, state: DeviceState, manifest: Mapping) -> Path:
    """Write `state` for the export `manifest` describes, atomically (a kill leaves the previous file whole)."""
    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state.tensors.items()}
    for slot, values in state.slots.items():
        tensors |= {f"{slot}:{name}": t.detach().to("cpu", copy=True).contiguous() for name, t in values.items()}
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "base_fingerprint": manifest["base_fingerprint"],
        "program_sha256": program_sha256(manifest),
        "step": str(state.step),
        "epoch": str(state.epoch),
        "batch": str(state.batch),
        "order_seed": str(state.order_seed),
        "examples_sha256": state.examples_sha256,
    }
    metadata[_CONTENT] = content_sha256(metadata, tensors)
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def _whole_number(path: Path, metadata: Mapping[str, str], key: str) -> int:
    try:
        value = int(metadata.get(key, ""))
    except ValueError:
        value = -1
    if value < 0:
        raise DeviceFileError(f"{str(path)!r}: {key}={metadata.get(key)!r} is not a whole number")
    return value


def read_state(path: str | os.PathLike, manifest: Mapping) -> DeviceState:
    """A state file, checked against the export it must belong to, before any of it is used.

    Raises:
        FileNotFoundError: no file at `path`.
        DeviceFileError: the file is truncated or damaged (unreadable, or its content hash differs),
            not a state file, or belongs to another base model, another training program, or holds
            other tensors than the manifest lists.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training state file at {str(path)!r}")
    advice = "; resume from an intact state file, or start again from the export's state.safetensors"
    metadata, tensors = read_safetensors(path, advice)
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise DeviceFileError(
            f"{str(path)!r} is not a far.device training state of version {FORMAT_VERSION} (format "
            f"{metadata.get('format')!r}, version {metadata.get('format_version')!r})"
        )
    if metadata.get(_CONTENT) != content_sha256(metadata, tensors):
        raise DeviceFileError(
            f"{str(path)!r} is damaged: its contents do not match the sha256 recorded when it was written"
        )
    if metadata.get("base_fingerprint") != manifest["base_fingerprint"]:
        raise DeviceFileError(
            f"{str(path)!r} belongs to another base model than this export (base fingerprints differ); use the "
            "state file written for this export folder"
        )
    if metadata.get("program_sha256") != program_sha256(manifest):
        raise DeviceFileError(
            f"{str(path)!r} was written for another training program (another export of this base: other learners, "
            "batch size or length); use the state file written for this export folder"
        )
    specs = {spec["name"]: spec for spec in manifest["trainable"]}
    values = {k: t for k, t in tensors.items() if k in specs}
    slots: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        slot, _, name = key.partition(":")
        if key not in specs and name in specs and slot in SLOTS[manifest["optimizer"]["name"]]:
            slots.setdefault(slot, {})[name] = tensor
    held = len(values) + sum(len(v) for v in slots.values())
    if set(values) != set(specs) or held != len(tensors) or any(set(v) != set(specs) for v in slots.values()):
        raise DeviceFileError(
            f"{str(path)!r} holds other tensors than the manifest's trainable list and its "
            f"{manifest['optimizer']['name']} state"
        )
    for name, tensor in (*values.items(), *(item for v in slots.values() for item in v.items())):
        spec = specs[name]
        if list(tensor.shape) != spec["shape"] or str(tensor.dtype).removeprefix("torch.") != spec["dtype"]:
            raise DeviceFileError(
                f"{str(path)!r}: {name} is {list(tensor.shape)} {tensor.dtype}, the manifest says {spec['shape']} "
                f"{spec['dtype']}"
            )
    return DeviceState(
        tensors={name: values[name] for name in specs},
        slots={slot: {name: v[name] for name in specs} for slot, v in slots.items()},
        step=_whole_number(path, metadata, "step"),
        epoch=_whole_number(path, metadata, "epoch"),
        batch=_whole_number(path, metadata, "batch"),
        order_seed=_whole_number(path, metadata, "order_seed"),
        examples_sha256=metadata.get("examples_sha256", ""),
    )
