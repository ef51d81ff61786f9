"""A GGUF file read tensor by tensor into the lean runtime: no dequantised copy of the whole model.

Each tensor is read with a plain file read (a memory map's pages would stay resident), dequantised with
the `gguf` package and stored compactly before the next, so loading peaks at the compact model plus one
tensor. A Q8_0 token embedding stays as Q8_0 blocks (`Q8Embedding`). As in transformers' GGUF loader,
llama.cpp's permuted Llama q/k rows and Gemma's 1 + w norm weights are undone.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from far.llm.compact import DenseEmbedding, Q8Embedding
from far.llm.gguf_source import GGUFSource
from far.llm.lean_config import LeanConfig, gemma3_layer_types
from far.llm.lean_model import LeanCausalLM

# GGUF tensor names -> transformers names, per block and for the whole model.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
}
_LLAMA_BLOCK = {"ffn_norm": "post_attention_layernorm"}
_GEMMA_BLOCK = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


# GGUF metadata value types: struct format of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the row length first
    tensor_type: GGMLQuantizationType
    data_offset: int  # from the start of the file

    @property
    def rows_and_bytes(self) -> tuple[int, int]:
        """(rows, bytes per row) of the stored tensor."""
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        return int(np.prod(self.shape[1:])), self.shape[0] // block * size


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's metadata (scalars and strings; arrays other than strings are skipped) and tensor table."""

    fields: dict
    tensors: dict[str, TensorInfo]


class GGUFFileError(ValueError):
    """Not a GGUF file the lean runtime can read: truncated, damaged, or claiming what it does not hold."""


class _Bounded:
    """Reads a GGUF header, refusing any count, length or read the file's size cannot back, before allocating."""

    def __init__(self, f: BinaryIO, path: str | os.PathLike) -> None:
        self.f, self.path = f, path
        self.size = os.fstat(f.fileno()).st_size

    def fail(self, what: str) -> GGUFFileError:
        return GGUFFileError(f"{self.path} is not a GGUF file far can read: {what}; is the file complete?")

    def left(self) -> int:
        return self.size - self.f.tell()

    def bytes(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise self.fail(f"{what} claims {n:,} bytes where {self.left():,} are left")
        return self.f.read(n)

    def read(self, fmt: str, what: str = "a number"):
        return struct.unpack("<" + fmt, self.bytes(struct.calcsize("<" + fmt), what))[0]

    def count(self, each: int, what: str) -> int:
        """A count of items of at least `each` bytes each, checked against what is left of the file."""
        n = self.read("Q", what)
        if n * each > self.left():
            raise self.fail(f"{what} is {n:,}, more than the {self.left():,} bytes left can hold")
        return n

    def string(self, what: str) -> str:
        return self.bytes(self.read("Q", what), what).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool, depth: int = 0):
        if kind == _STRING:
            return self.string("a string")
        if kind != _ARRAY:
            if kind not in _SCALARS:
                raise self.fail(f"a metadata value of unknown type {kind}")
            return self.read(_SCALARS[kind], "a metadata value")
        item = self.read("I", "an array's type")
        if depth > 1 or (item not in _SCALARS and item not in (_STRING, _ARRAY)):
            raise self.fail(f"an array of unknown or nested type {item}")
        if item in _SCALARS:  # fixed size: skipped in one seek (token scores, types, ...)
            size = struct.calcsize("<" + _SCALARS[item])
            n = self.count(size, "an array's length")
            self.f.seek(n * size, os.SEEK_CUR)
            return None
        values = [self.value(item, keep, depth + 1) for _ in range(self.count(8, "an array's length"))]
        return values if keep else None


def _tensor_info(r: _Bounded, start: int, name: str, shape: tuple[int, ...], kind: int, offset: int) -> TensorInfo:
    """One tensor's entry, checked: a known type, whole blocks, its bytes inside the file."""
    try:
        tensor_type = GGMLQuantizationType(kind)
        block, size = GGML_QUANT_SIZES[tensor_type]
    except (ValueError, KeyError):
        raise r.fail(f"tensor {name!r} has the unknown type {kind}") from None
    if not shape or len(shape) > 4 or min(shape) < 1 or shape[0] % block:
        raise r.fail(f"tensor {name!r} has the shape {list(shape)}")
    info = TensorInfo(name, shape, tensor_type, start + offset)
    rows, row_bytes = info.rows_and_bytes
    if info.data_offset + rows * row_bytes > r.size:
        raise r.fail(f"tensor {name!r} ({rows * row_bytes:,} bytes at {info.data_offset:,}) runs past the file's end")
    return info


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse the metadata and tensor table of a GGUF file (version 2 or 3) without mapping it.

    The vocabulary is walked over, not kept: `gguf.GGUFReader` builds a numpy view per element, which for
    Gemma-3's 262k tokens costs seconds and hundreds of MB. Every extent is checked against the file's size.
    """
    with open(path, "rb") as f:
        r = _Bounded(f, path)
        if r.left() < 4 or f.read(4) != b"GGUF":
            raise GGUFFileError(f"{path} is not a GGUF file (no GGUF magic)")
        version = r.read("I", "the version")
        if version not in (2, 3):
            raise GGUFFileError(f"{path} is GGUF version {version}; the lean runtime reads versions 2 and 3")
        n_tensors, n_fields = r.count(24, "the tensor count"), r.count(12, "the field count")
        fields = {}
        for _ in range(n_fields):
            key = r.string("a field's name")
            fields[key] = r.value(r.read("I", "a field's type"), keep=not key.startswith("tokenizer."))
        infos = []
        for _ in range(n_tensors):
            name = r.string("a tensor's name")
            dims = r.read("I", "a tensor's dimensions")
            if dims > 4:
                raise r.fail(f"tensor {name!r} has {dims} dimensions")
            shape = tuple(r.read("Q", "a tensor's shape") for _ in range(dims))
            infos.append((name, shape, r.read("I", "a tensor's type"), r.read("Q", "a tensor's offset")))
        alignment = fields.get("general.alignment") or 32
        if not isinstance(alignment, int) or not 0 < alignment <= 1 << 20:
            raise r.fail(f"general.alignment is {alignment!r}")
        start = -(-f.tell() // alignment) * alignment
        tensors = {info[0]: _tensor_info(r, start, *info) for info in infos}
    return GGUFHeader(fields, tensors)


def _field(header: GGUFHeader, key: str, default=None):
    value = header.fields.get(key)
    return default if value is None else value


def _positive(header: GGUFHeader, key: str, most: int = 1 << 24) -> int:
    value = header.fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise GGUFFileError(f"the GGUF file's {key} is {value!r}, not a size between 1 and {most:,}")
    return value


def read_config(header: GGUFHeader) -> LeanConfig:
    """The `LeanConfig` of a llama or gemma3 GGUF file's metadata (`GGUFFileError` where it describes no model)."""
    try:
        return _config(header)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as error:
        if isinstance(error, GGUFFileError):
            raise
        raise GGUFFileError(f"the GGUF file's metadata does not describe a model ({error})") from None


def _config(reader: GGUFHeader) -> LeanConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "gemma3"):
        raise GGUFFileError(
            f"the lean runtime reads llama and gemma3 GGUF files, this one is {arch!r}; load it with "
            "far.models.load_causal_lm (transformers) instead"
        )
    if "token_embd.weight" not in reader.tensors:
        raise GGUFFileError("the GGUF file has no token_embd.weight tensor")
    embd = reader.tensors["token_embd.weight"]
    hidden = _positive(reader, f"{arch}.embedding_length")
    heads = _positive(reader, f"{arch}.attention.head_count")
    layers = _positive(reader, f"{arch}.block_count", most=1024)
    _positive(reader, f"{arch}.feed_forward_length")
    head_dim = _field(reader, f"{arch}.attention.key_length") or _field(reader, f"{arch}.rope.dimension_count")
    head_dim = head_dim or hidden // heads
    common = dict(
        arch=arch,
        vocab_size=int(embd.shape[1]),
        hidden_size=hidden,
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    )
    if arch == "gemma3":
        # Not in the file: llama.cpp and transformers fix Gemma-3's local rotary base at 10,000 and
        # its pattern at one global layer in six; query_pre_attn_scalar is the head size for 270M.
        return LeanConfig(
            **common,
            rope_local_theta=10000.0,
            layer_types=gemma3_layer_types(layers),
            sliding_window=_field(reader, f"{arch}.attention.sliding_window"),
            query_scale=head_dim**-0.5,
        )
    return LeanConfig(**common, rope_local_theta=common["rope_theta"])


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's rotary layout interleaves each head's halves; transformers' splits them.
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


class _TensorReader:
    """Reads one tensor's bytes at a time from the open file and dequantises them to fp32."""

    def __init__(self, path: Path, header: GGUFHeader, config: LeanConfig) -> None:
        self.file = open(path, "rb")  # noqa: SIM115 - closed by load_lean_model
        self.tensors = header.tensors
        self.config = config
        self.hf_to_gguf = {"model.norm.weight": "output_norm.weight"}
        block = _BLOCK_NAMES | (_GEMMA_BLOCK if config.is_gemma else _LLAMA_BLOCK)
        for i in range(config.num_layers):
            for gguf_name, hf_name in block.items():
                self.hf_to_gguf[f"model.layers.{i}.{hf_name}.weight"] = f"blk.{i}.{gguf_name}.weight"

    def raw(self, gguf_name: str) -> np.ndarray:
        t = self.tensors[gguf_name]
        rows, row_bytes = t.rows_and_bytes
        self.file.seek(t.data_offset)
        data = np.frombuffer(bytearray(self.file.read(rows * row_bytes)), dtype=np.uint8).reshape(rows, row_bytes)
        if t.tensor_type == GGMLQuantizationType.F32:
            return data.view(np.float32)
        if t.tensor_type == GGMLQuantizationType.F16:
            return data.view(np.float16)
        return data

    def __call__(self, hf_name: str) -> torch.Tensor:
        gguf_name = self.hf_to_gguf.get(hf_name)
        if gguf_name is None or gguf_name not in self.tensors:
            raise KeyError(f"the GGUF file has no tensor for {hf_name} ({gguf_name})")
        t = self.tensors[gguf_name]
        values = dequantize(self.raw(gguf_name), t.tensor_type).astype(np.float32, copy=False)
        c = self.config
        if c.arch == "llama" and ".attn_q." in gguf_name:
            values = _unpermute(values, c.num_heads)
        elif c.arch == "llama" and ".attn_k." in gguf_name:
            values = _unpermute(values, c.num_kv_heads)
        if c.is_gemma and gguf_name.endswith("norm.weight"):
            values = values - 1.0
        return torch.from_numpy(np.ascontiguousarray(values))


@contextlib.contextmanager
def read_weights(path: str | os.PathLike) -> Iterator[tuple[LeanConfig, Callable[[str], torch.Tensor]]]:
    """The file's config, and its weights by transformers name in fp32, one at a time."""
    path = Path(path)
    header = read_header(path)
    try:
        config = read_config(header)
    except GGUFFileError as error:
        raise GGUFFileError(f"{path}: {error}") from None
    tensors = _TensorReader(path, header, config)
    try:
        yield config, tensors
    finally:
        tensors.file.close()


def load_lean_model(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> LeanCausalLM:
    """A `LeanCausalLM` from a llama or gemma3 GGUF file, weights stored in `dtype` (all frozen).

    Raises:
        GGUFFileError (a ValueError): not a GGUF file, a damaged or truncated one, one whose metadata or tensors
            claim what the file does not hold, or an architecture other than llama and gemma3.
    """
    with read_weights(path) as (config, tensors):
        try:
            return _build(Path(path), config, tensors, dtype)
        except (KeyError, RuntimeError, ValueError, TypeError, IndexError, ZeroDivisionError) as error:
            if isinstance(error, GGUFFileError):
                raise
            # every extent was checked against the file's size, so what is left is a file whose tensors do not
            # fit the model its metadata describes
            raise GGUFFileError(
                f"{path} is not a GGUF file far can read: its tensors do not fit the model its metadata describes "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from error


def _build(path: Path, config: LeanConfig, tensors: _TensorReader, dtype: torch.dtype) -> LeanCausalLM:
    embd = tensors.tensors["token_embd.weight"]
    if embd.tensor_type == GGMLQuantizationType.Q8_0:
        embedding = Q8Embedding(torch.from_numpy(tensors.raw("token_embd.weight")), config.hidden_size)
    else:
        values = dequantize(tensors.raw("token_embd.weight"), embd.tensor_type)
        embedding = DenseEmbedding(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), dtype)
    model = LeanCausalLM(config, embedding, tensors, dtype)
    model.source = GGUFSource.of(path)
    return model.eval()
