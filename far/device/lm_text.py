"""A user's texts for a causal LM export: packed chunks of token ids in one file, which every runtime reads.

    OUT/text.safetensors:  train      int32 (N, max_length)  the training chunks
                           held_out   int32 (M, max_length)  the held-out chunks (scored for perplexity)
    metadata:              format "far.device.chunks", format_version "1", base_fingerprint, max_length,
                           vocab_size, source (the texts' path), holdout (the share held out)

The texts are read, tokenised and packed as `far train --train-file` packs them (`far.data.texts`:
whole documents held out where possible, no padding), so a device run trains on the chunks a host
run would. int32 keeps the file half the size of int64 ids; every vocabulary far reads fits.

    >>> write_chunks(load_text_chunks("notes/", tokenizer, 256), "OUT/text.safetensors", manifest)
    >>> train, held_out, sha = read_chunks("OUT/text.safetensors", manifest)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from far.data.texts import TextChunks
from far.device.manifest import DeviceFileError, read_safetensors, sha256_file
from far.storage.atomic import atomic_file

FORMAT, FORMAT_VERSION = "far.device.chunks", "1"
CHUNKS = "text.safetensors"  # the export folder's chunks, written by `far export --model NAME --train-file`


def write_chunks(texts: TextChunks, path: str | os.PathLike, manifest: Mapping) -> Path:
    """Write packed chunks (`far.data.texts.load_text_chunks`) for the export `manifest` describes, atomically.

    Raises:
        ValueError: chunks of another length than the export's, or ids outside its vocabulary.
    """
    length, vocab = int(manifest["max_length"]), int(manifest["vocab_size"])
    for name, chunks in (("training", texts.train), ("held-out", texts.validation)):
        if chunks.dim() != 2 or chunks.shape[1] != length:
            raise ValueError(f"the {name} chunks are {list(chunks.shape)}, not (N, {length}): pack them to max_length")
        if chunks.numel() and (chunks.min() < 0 or chunks.max() >= vocab):
            raise ValueError(f"the {name} chunks hold ids outside the export's vocabulary of {vocab}")
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "base_fingerprint": manifest["base_fingerprint"],
        "max_length": str(length),
        "vocab_size": str(vocab),
        "source": str(texts.info.get("train_source", "")),
        "holdout": str(texts.info.get("holdout")),
    }
    tensors = {"train": texts.train.to(torch.int32).contiguous(), "held_out": texts.validation.to(torch.int32)}
    with atomic_file(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
    return Path(path)


def read_chunks(path: str | os.PathLike, manifest: Mapping) -> tuple[Tensor, Tensor, str]:
    """(train, held_out) int64 chunks of a chunks file written for this export, and the file's sha256.

    Raises:
        DeviceFileError: not a chunks file, or one written for another export (base, length, vocabulary).
    """
    path = Path(path)
    metadata, tensors = read_safetensors(path, "; write it with far export --model NAME --train-file TEXTS")
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise DeviceFileError(
            f"{str(path)!r} is not a chunks file of format {FORMAT} {FORMAT_VERSION} (far export --model NAME "
            "--train-file TEXTS writes one as OUT/text.safetensors)"
        )
    if metadata.get("base_fingerprint") != manifest["base_fingerprint"]:
        raise DeviceFileError(f"{str(path)!r} was written for another base model; write it for this export")
    length, vocab = int(manifest["max_length"]), int(manifest["vocab_size"])
    out = []
    for name in ("train", "held_out"):
        chunks = tensors.get(name)
        if chunks is None or chunks.dtype != torch.int32 or chunks.dim() != 2 or chunks.shape[1] != length:
            raise DeviceFileError(f"{str(path)!r}: {name} must be int32 (N, {length}); write it for this export")
        if chunks.numel() and (chunks.min() < 0 or chunks.max() >= vocab):
            raise DeviceFileError(f"{str(path)!r}: {name} holds ids outside the vocabulary of {vocab}")
        out.append(chunks.long())
    return out[0], out[1], sha256_file(path)


def is_chunks_file(path: str | os.PathLike) -> bool:
    """Whether `path` holds packed chunks (this module's format), from its header alone."""
    try:
        with safe_open(Path(path), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except Exception:  # SafetensorError and OSError alike: not this format
        return False
