"""A learners file per user for a GGUF causal LM: only what a fine-tune changed, applied in place on the stock model.

Every user has the same stock GGUF file; a user's file holds what that user's fine-tune changed:

- `<ffn>.learner_indices` (k,) int64, sorted: the learner nodes of an FFN, named (as FAR names FFNs)
  by its output projection, `layers.27.mlp.down_proj`;
- `layers.27.mlp.{gate,up}_proj.learner_weight` (k, hidden) and `layers.27.mlp.down_proj.learner_weight`
  (hidden, k): those nodes' rows and columns, in nn.Linear layout, nodes ascending;
- every other weight the fine-tune trained, whole, under its transformers name less `model.`
  (`layers.27.self_attn.q_proj.weight`, `layers.27.input_layernorm.weight`, `norm.weight`).

Each of those values is kept one of two ways (metadata `values`), whichever is smaller. `raw`: as the
model stored it. `delta8`, for bfloat16 values: `<name>.delta`, int8, the difference of the value's bit
pattern from the stock value's (the dequantised GGUF weight in bf16, as the lean model stores it), with
`<name>.patch_index` (n,) int32 and `<name>.patch_value` (n,) bf16 for the values whose difference does
not fit in int8. MeZO moves a bf16 weight a few units of its last place at a time (stochastic rounding,
`far.llm.compact`), so most values fit: one byte a value instead of two, exactly. Those that do not are
small ones, whose last place is so small that their moves add up to more than 127 of them.

The metadata holds the format and its version, the base GGUF file's name, size and sha256 (the base
fingerprint: `far.llm.gguf_source`), the model's `LeanConfig`, and a sha256 of the file's contents, so
that a file for another base, a corrupted or truncated file, or an encoder's learners file is refused
before the model is touched.

    >>> far.load_learners(model, "alice.safetensors")   # model: the stock far.models.load_lean_lm(...)
    >>> far.load_learners(model, "bob.safetensors")     # Alice's values back first, then Bob's
    >>> far.unload_learners(model)                      # the stock model, bit for bit
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from far.llm.compact import CompactLinear, CompactWeight
from far.llm.lean_far import NODE_DIM, OUTPUT, ffn_names, ffn_of
from far.llm.lean_model import LeanCausalLM
from far.saving.safetensors_file import CONTENT_KEY, DTYPES, read_verified, sorted_node_indices

FORMAT, FORMAT_VERSION = "far.lean-learners", "1"
ENCODER_FORMAT = "far.learners"  # far.save_learners' files, for encoders
LEGACY_FORMAT = "far-lean-trained/1"  # what save_trained wrote before this format
ACTIVE_ATTRIBUTE = "far_learners"  # where a model keeps the file it holds (as the encoders' `far.saving.active`)
INDICES, LEARNERS = ".learner_indices", ".learner_weight"
DELTA, PATCH_INDEX, PATCH_VALUE = ".delta", ".patch_index", ".patch_value"
RAW, DELTA8 = "raw", "delta8"


class LeanLearnersFileError(ValueError):
    """A learners file that cannot be applied to this lean model: corrupted, foreign, or for another base."""


@dataclass(frozen=True)
class Slot:
    """Where one value of a learners file goes: a weight, whole (`nodes` None) or at nodes along `node_dim`."""

    key: str
    weight: CompactWeight
    node_dim: int = 0
    nodes: Tensor | None = None

    def read(self) -> Tensor:
        stored = self.weight.stored.detach()
        return stored.clone() if self.nodes is None else stored.index_select(self.node_dim, self.nodes)

    def write(self, value: Tensor) -> None:
        stored = self.weight.stored.detach()
        if self.nodes is None:
            stored.copy_(value)
        else:
            stored.index_copy_(self.node_dim, self.nodes, value.to(stored.dtype))


@dataclass
class ActiveLeanLearners:
    """The learners file applied to a lean model (`model.far_learners`), and the stock values it overwrote."""

    path: str
    content_sha256: str
    base: list[tuple[Slot, Tensor]]
    # {file identity: content sha256} of the files this model verified: an unchanged one is not hashed again.
    verified: dict[tuple, str] = field(default_factory=dict, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(value.numel() * value.element_size() for _, value in self.base)


def value_key(name: str) -> str:
    """A `CompactWeight`'s name in a learners file: a projection's block `parts.0` -> `weight` (norms keep theirs)."""
    return name.removesuffix(".parts.0") + ".weight" if name.endswith(".parts.0") else name


def encode(value: Tensor, stock: Tensor) -> tuple[str, dict[str, Tensor]]:
    """`value` as `delta8` against `stock`, when that is exact and smaller, else `raw`: the encoding and its
    tensors by suffix.
    """
    value = value.detach().contiguous()
    if value.dtype != torch.bfloat16 or value.numel() > torch.iinfo(torch.int32).max:
        return RAW, {"": value}
    diff = value.view(torch.int16).int() - stock.to(torch.bfloat16).contiguous().view(torch.int16).int()
    fits = diff.abs() <= 127
    patch = (~fits).reshape(-1).nonzero().squeeze(1).to(torch.int32)
    if value.numel() + patch.numel() * 6 >= value.numel() * value.element_size():  # int8 each, int32 + bf16 a patch
        return RAW, {"": value}
    delta = torch.where(fits, diff, 0).to(torch.int8)
    return DELTA8, {DELTA: delta, PATCH_INDEX: patch, PATCH_VALUE: value.reshape(-1)[patch].clone()}


def decode(encoding: str, parts: Mapping[str, Tensor], stock: Tensor) -> Tensor:
    """The value `encode` kept, from its tensors and the same `stock`."""
    if encoding == RAW:
        return parts[""]
    base = stock.to(torch.bfloat16).contiguous().view(torch.int16)
    # A fitting difference never leaves int16's range: the sum is the value's own bit pattern.
    value = (base + parts[DELTA].to(torch.int16)).view(torch.bfloat16)
    value.view(-1)[parts[PATCH_INDEX].long()] = parts[PATCH_VALUE]
    return value


def config_record(model: LeanCausalLM) -> dict:
    """The model's `LeanConfig` as a learners file records it (JSON types)."""
    return json.loads(json.dumps(dataclasses.asdict(model.config)))


def stock_slots(model: LeanCausalLM) -> dict[str, Slot]:
    """Every weight a learners file may overwrite whole, by its key (the embedding is never trained)."""
    return {
        value_key(name): Slot(value_key(name), module)
        for name, module in model.named_modules()
        if isinstance(module, CompactWeight)
    }


def check_stock(model: LeanCausalLM) -> None:
    """Raise unless `model` is a stock lean model from a GGUF file: FFNs whole, nothing training."""
    if not isinstance(model, LeanCausalLM):
        raise TypeError(f"expected a far.llm.lean_model.LeanCausalLM, got {type(model).__name__}")
    if model.source is None:
        raise ValueError(
            "this lean model was not read from a GGUF file, so no learners file can be checked against its base; "
            "load it with far.models.load_lean_lm(name) (or far.llm.gguf_file.load_lean_model(path))"
        )
    if any(isinstance(m, CompactLinear) and len(m.parts) != 1 for m in model.modules()):
        raise ValueError(
            "this model's FFNs are split for training; a learners file goes onto the stock model as "
            "far.models.load_lean_lm(name) returns it"
        )
    if any(w.trainable for w in model.compact_weights()):
        raise ValueError(
            "this model has trainable weights (it is being trained); a learners file goes onto the stock model as "
            "far.models.load_lean_lm(name) returns it"
        )


def _fail(path: Path, message: str) -> LeanLearnersFileError:
    return LeanLearnersFileError(f"{str(path)!r} {message}")


def check_format(path: Path, metadata: Mapping[str, str]) -> None:
    """Raise unless the metadata says a GGUF causal LM's learners file of the version this far reads."""
    found = metadata.get("format")
    if found == ENCODER_FORMAT:
        raise _fail(
            path,
            "is an encoder's learners file (far.save_learners); load it onto its encoder base model "
            "(far predict --model BASE --learners FILE), not onto a GGUF causal LM",
        )
    if found == LEGACY_FORMAT:
        raise _fail(
            path,
            f"was written by an earlier far ({LEGACY_FORMAT}: every trained weight whole), which this far no longer "
            "reads; train again to get a learners file",
        )
    if found != FORMAT:
        raise _fail(
            path,
            f"is not a learners file of a GGUF causal LM (format={found!r}); "
            "far.llm.lean_saving.save_trained writes one",
        )
    if metadata.get("format_version") != FORMAT_VERSION:
        raise _fail(
            path,
            f"is of format version {metadata.get('format_version')!r}; this far reads version {FORMAT_VERSION}: "
            "upgrade far, or save the fine-tune again",
        )


def read_file(
    path: str | os.PathLike, verified: dict[tuple, str] | None = None
) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensors of a GGUF model's learners file, verified (`read_verified`)."""
    return read_verified(
        path, check_format, LeanLearnersFileError, writer="far.llm.lean_saving.save_trained", verified=verified
    )


def _json(path: Path, metadata: Mapping[str, str], key: str) -> dict:
    try:
        value = json.loads(metadata[key])
    except (KeyError, ValueError) as error:
        raise _fail(path, f"lacks valid metadata {key!r} ({error}); save the fine-tune again") from error
    if not isinstance(value, dict):
        raise _fail(path, f"has invalid metadata {key!r}: not a JSON object")
    return value


def values_dtype(path: str | os.PathLike) -> torch.dtype:
    """The widest dtype of a learners file's values, from its header: what the base must be loaded in.

    A first-order run writes float32 learners, which a bf16 base cannot hold exactly (`plan` refuses that).
    An unreadable header says bfloat16 here: the file is refused, with its reason, when applied.
    """
    try:
        with safe_open(Path(path), framework="pt") as f:
            values = json.loads((f.metadata() or {}).get("values", "{}"))
    except Exception:  # SafetensorError, OSError, ValueError alike
        return torch.bfloat16
    dtypes = {DTYPES.get((spec or {}).get("dtype")) for spec in values.values()} if isinstance(values, dict) else set()
    return torch.float32 if torch.float32 in dtypes else torch.bfloat16


def plan(
    model: LeanCausalLM,
    path: str | os.PathLike,
    metadata: Mapping[str, str],
    tensors: Mapping[str, Tensor],
    *,
    retype: bool = False,
) -> list[tuple[Slot, str, dict[str, Tensor]]]:
    """Check a read file against the stock `model` and say where each value goes.

    Args:
        retype: Accept values in a dtype the model's storage cannot hold exactly (the caller replaces the storage).

    Returns:
        `[(slot, encoding, {suffix: tensor})]`, learner nodes as index tensors on their slots.

    Raises:
        LeanLearnersFileError: another base GGUF file or model shape, or a tensor that does not fit.
    """
    path = Path(path)
    source = model.source
    want = (metadata.get("base_sha256"), metadata.get("base_file"), metadata.get("base_bytes"))
    if want[0] != source.sha256():
        raise _fail(
            path,
            f"was trained from {want[1]} ({want[2]} bytes, sha256 {str(want[0])[:12]}...), not from this model's "
            f"{source.path.name} ({source.size} bytes, sha256 {source.sha256()[:12]}...): load it onto the GGUF "
            "model it was trained from (far generate --model BASE)",
        )
    if _json(path, metadata, "lean_config") != config_record(model):
        raise _fail(path, "was saved from a model of another shape than this one, though from the same GGUF file")
    values = _json(path, metadata, "values")
    slots = stock_slots(model)
    ffns = dict(zip(ffn_names(model), model.layers, strict=True))
    n_nodes = model.config.intermediate_size
    used, planned = set(), []
    for key, spec in values.items():
        encoding, dtype = (spec or {}).get("encoding"), DTYPES.get((spec or {}).get("dtype"))
        if encoding not in (RAW, DELTA8) or dtype is None or (encoding == DELTA8 and dtype != torch.bfloat16):
            raise _fail(path, f"has an invalid entry for {key}: {spec!r}")
        slot = _slot(path, key, slots, ffns, tensors, n_nodes)
        if slot.nodes is not None:
            used.add(ffn_of(key) + INDICES)
        shape = tuple(slot.weight.stored.shape)
        if slot.nodes is not None:
            shape = tuple(len(slot.nodes) if d == slot.node_dim else s for d, s in enumerate(shape))
        stored = slot.weight.stored.dtype
        if not retype and dtype != stored and not (dtype == torch.bfloat16 and stored == torch.float32):
            raise _fail(
                path,
                f"holds {key} in {dtype}, which this model stores in {stored}: load the base with "
                f"far.models.load_lean_lm(name, dtype={dtype})",
            )
        expected = {"": (shape, dtype)} if encoding == RAW else {DELTA: (shape, torch.int8)}
        parts = {}
        for suffix, (want_shape, want_dtype) in expected.items():
            tensor = tensors.get(key + suffix)
            if tensor is None or tuple(tensor.shape) != want_shape or tensor.dtype != want_dtype:
                found = None if tensor is None else (list(tensor.shape), tensor.dtype)
                raise _fail(path, f"holds {key + suffix} as {found}, the model needs {list(want_shape)} {want_dtype}")
            parts[suffix] = tensor
        if encoding == DELTA8:
            index, patch = tensors.get(key + PATCH_INDEX), tensors.get(key + PATCH_VALUE)
            n = parts[DELTA].numel()
            ok = index is not None and patch is not None and index.dtype == torch.int32 and index.dim() == 1
            ok = ok and patch.dtype == dtype and tuple(patch.shape) == tuple(index.shape)
            if not ok or (index.numel() and (index.min() < 0 or index.max() >= n)):
                raise _fail(path, f"has an invalid patch for {key}")
            parts[PATCH_INDEX], parts[PATCH_VALUE] = index, patch
        used.update(key + suffix for suffix in parts)
        planned.append((slot, encoding, parts))
    stray = sorted(set(tensors) - used)
    if stray:
        raise _fail(path, f"holds tensors its metadata does not describe ({stray[:3]}); save the fine-tune again")
    return planned


def _slot(path: Path, key: str, slots, ffns, tensors: Mapping[str, Tensor], n_nodes: int) -> Slot:
    if not key.endswith(LEARNERS):
        if key not in slots:
            raise _fail(path, f"holds {key!r}, which is no weight of this model; it belongs to another model")
        return slots[key]
    layer, _, proj = key.removesuffix(LEARNERS).rpartition(".mlp.")
    ffn = f"{layer}.mlp.{OUTPUT}"
    if ffn not in ffns or proj not in NODE_DIM:
        raise _fail(path, f"holds {key!r}, which is no FFN projection of this model; it belongs to another model")
    nodes = tensors.get(ffn + INDICES)
    if not sorted_node_indices(nodes, n_nodes):
        raise _fail(path, f"needs {ffn + INDICES}: sorted distinct int64 node indices in [0, {n_nodes})")
    weight = slots[f"{layer}.mlp.{proj}.weight"].weight
    return Slot(key, weight, NODE_DIM[proj], nodes)


def active_lean_learners(model: LeanCausalLM) -> ActiveLeanLearners | None:
    active = getattr(model, ACTIVE_ATTRIBUTE, None)
    return active if isinstance(active, ActiveLeanLearners) else None


@torch.no_grad()
def revert(model: LeanCausalLM, active: ActiveLeanLearners) -> None:
    """Write the stock values `active` overwrote back, and forget it."""
    for slot, value in active.base:
        slot.write(value)
    delattr(model, ACTIVE_ATTRIBUTE)


@torch.no_grad()
def load_learners(model: LeanCausalLM, path: str | os.PathLike) -> LeanCausalLM:
    """Apply a GGUF causal LM's learners file (`far.llm.lean_saving.save_trained`) to the stock model, in place.

    A model holding another user's file gets the stock values back first, so that it then holds exactly
    stock + this file (A -> B -> A leaves it as loading A fresh, bit for bit); it keeps the stock values
    this file overwrites for that. Everything is checked before the model is touched.

    Args:
        model: The stock model (`far.models.load_lean_lm(name)`), or one holding another user's file.
        path: A learners file.

    Returns:
        The same model.

    Raises:
        LeanLearnersFileError (a ValueError): a corrupted or truncated file, an encoder's learners file,
            a file for another GGUF file or model shape, or one whose values this model's dtype cannot hold.

    Example:
        >>> model, tokenizer = far.models.load_lean_lm("smollm2-135m")
        >>> far.load_learners(model, "alice.safetensors")
    """
    check_stock(model)
    active = active_lean_learners(model)
    verified = {} if active is None else active.verified
    metadata, tensors = read_file(path, verified)
    planned = plan(model, path, metadata, tensors)
    # Everything is checked; from here on nothing raises on bad input.
    kept: dict[str, Tensor] = {}  # stock values of whole weights this file overwrites too: not written back
    if active is not None:
        rewritten = {slot.key for slot, _, _ in planned if slot.nodes is None}
        for slot, stock in active.base:
            if slot.nodes is None and slot.key in rewritten:
                kept[slot.key] = stock
            else:
                slot.write(stock)
        delattr(model, ACTIVE_ATTRIBUTE)
    base = []
    for slot, encoding, parts in planned:
        stock = kept.pop(slot.key) if slot.key in kept else slot.read()
        base.append((slot, stock))
        slot.write(decode(encoding, parts, stock))
    setattr(model, ACTIVE_ATTRIBUTE, ActiveLeanLearners(str(path), metadata[CONTENT_KEY], base, verified))
    return model


def unload_learners(model: LeanCausalLM) -> LeanCausalLM:
    """Take the active learners file off `model`, in place: the stock model again, bit for bit."""
    active = active_lean_learners(model)
    if active is None:
        raise ValueError("no learners file is loaded on this model (far.load_learners(model, path) loads one)")
    revert(model, active)
    return model
