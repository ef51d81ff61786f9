"""sha256 digests of tensors: a file's named tensors as one digest, or each tensor whole or one per row, kept until
the tensor is written.

`hash_tensors` is the one content digest of named tensors: a prefix (a file's metadata), then for each tensor, in
name order, a header that fixes the byte length of what follows and its bytes in C order. Learners files
(`content_sha256`) and the device's state file (its own header) both use it.

Checking a learners file against its base hashes the base's frozen values (~70 MB for a MiniLM with frozen
embeddings) on every swap although they never change. A `DigestCache` keeps each digest with what identifies
its bytes: the storage (weakly referenced, so memory freed and reused never matches), the view's offset, shape,
stride and dtype, and the version counter PyTorch bumps on every in-place write through any view. Writes that
bypass the counter (`tensor.data`, a NumPy view, `set_`) are not seen: such code must drop the cache
(`far.saving.unload_learners`, `DigestCache.clear`); FAR writes frozen values through their parameters only.
An entry goes with its storage (a weak-reference callback), so a model serving many users holds the digests
of its live tensors only. Row digests let the fingerprint of any subset of a projection's nodes be combined
from 32-byte digests without reading the weights again.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch
from torch import Tensor

DIGEST_BYTES = 32  # sha256
# The metadata key of a learners file's content hash (encoders' and the lean causal LM's files alike).
CONTENT_KEY = "content_sha256"


def tensor_bytes(tensor: Tensor) -> np.ndarray:
    """A tensor's values as C-order bytes, (n, row bytes) for 2-D and (bytes,) otherwise, on the CPU."""
    data = tensor.detach().to("cpu").contiguous()
    flat = data if data.dim() == 2 else data.reshape(-1)  # 2-D: (n, f), empty or not
    return flat.view(torch.uint8).numpy()  # any dtype, bf16 too


def json_header(name: str, dtype: str, shape: list[int]) -> bytes:
    """`["name", "dtype", [d0, d1, ...]]` and a newline: a learners file's and a base fingerprint's tensor header."""
    return json.dumps([name, dtype, shape]).encode() + b"\n"


def hash_tensors(
    tensors: Iterable[tuple[str, Tensor]],
    prefix: bytes = b"",
    header: Callable[[str, str, list[int]], bytes] = json_header,
) -> str:
    """sha256 (hex) over `prefix`, then every tensor in name order: `header(name, dtype, shape)` and its bytes."""
    digest = hashlib.sha256(prefix)
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        digest.update(header(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)))
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())  # bf16 too
    return digest.hexdigest()


def content_sha256(metadata: Mapping[str, str], tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]) -> str:
    """A learners file's `content_sha256`: its metadata (less this hash) as sorted JSON, then its tensors."""
    fields = {k: v for k, v in metadata.items() if k != CONTENT_KEY}
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return hash_tensors(items, prefix=json.dumps(fields, sort_keys=True).encode())


def sha256_rows(rows: Tensor) -> np.ndarray:
    """(n, 32) uint8: the sha256 of each row of a 2-D tensor's bytes."""
    if rows.dim() != 2:
        raise ValueError(f"expected a 2-D tensor of rows, got shape {tuple(rows.shape)}")
    data = tensor_bytes(rows)
    sha = hashlib.sha256
    joined = b"".join([sha(row).digest() for row in data])
    return np.frombuffer(joined, dtype=np.uint8).reshape(rows.shape[0], DIGEST_BYTES).copy()


def as_rows(tensor: Tensor) -> Tensor:
    """A 1-D tensor (a node bias) as (n, 1) rows, so that it is hashed like a weight; 2-D as it is."""
    return tensor.unsqueeze(1) if tensor.dim() == 1 else tensor


class DigestCache:
    """Digests of tensors' bytes (whole, or one per row), reused until the tensor is written.

    Example:
        >>> cache = DigestCache()
        >>> cache.rows(weight)  # (n, 32): hashed once
        >>> cache.rows(weight)  # the same, not hashed again
        >>> weight.add_(1.0)    # an in-place write moves the version counter
        >>> cache.rows(weight)  # hashed again
    """

    def __init__(self) -> None:
        # (kind, id(storage), offset, shape, stride, dtype, device) -> (storage ref, version, value)
        self._entries: dict[tuple, tuple[weakref.ref, int, object]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def tensor(self, tensor: Tensor) -> bytes:
        """sha256 of a tensor's bytes in C order (32 bytes)."""
        return self._get("tensor", tensor, lambda t: hashlib.sha256(tensor_bytes(t)).digest())

    def rows(self, rows: Tensor) -> np.ndarray:
        """(n, 32) uint8: the sha256 of each row of a 2-D tensor (read only; do not modify it)."""
        return self._get("rows", rows, sha256_rows)

    def put_rows(self, rows: Tensor, digests: np.ndarray) -> None:
        """Record the row digests of `rows`, which the caller has just written and knows (a swap moving rows it
        had hashed): they must be exactly the digests of what `rows` now holds.
        """
        if digests.shape != (rows.shape[0], DIGEST_BYTES):
            raise ValueError(f"expected ({rows.shape[0]}, {DIGEST_BYTES}) row digests, got {digests.shape}")
        self._put("rows", rows, digests)

    def carry(self, source: Tensor, target: Tensor) -> None:
        """`target` now holds exactly `source`'s values (a copy): reuse its digests, if any are valid."""
        if source.shape != target.shape or source.dtype != target.dtype:
            return
        for kind in ("tensor", "rows"):
            value = self._valid(kind, source)
            if value is not None:
                self._put(kind, target, value)

    def _key(self, kind: str, tensor: Tensor) -> tuple[tuple, torch.UntypedStorage]:
        storage = tensor.untyped_storage()
        geometry = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device)
        return (kind, id(storage), *geometry), storage

    def _valid(self, kind: str, tensor: Tensor) -> object | None:
        if tensor.is_inference():  # no version counter: never cached
            return None
        key, storage = self._key(kind, tensor)
        entry = self._entries.get(key)
        # The same storage object (not just the same address) and no write since.
        if entry is not None and entry[0]() is storage and entry[1] == tensor._version:
            return entry[2]
        return None

    def _put(self, kind: str, tensor: Tensor, value: object) -> None:
        if tensor.is_inference():
            return
        key, storage = self._key(kind, tensor)
        self._entries[key] = (weakref.ref(storage, _forget(weakref.ref(self), key)), tensor._version, value)

    def _get(self, kind: str, tensor: Tensor, compute) -> object:
        value = self._valid(kind, tensor)
        if value is None:
            value = compute(tensor)
            self._put(kind, tensor, value)
        return value


def _forget(cache: weakref.ref, key: tuple):
    """A weak-reference callback dropping an entry when its storage is freed (unless the key holds a newer one);
    it holds the cache weakly, so the cache is freed with its model.
    """

    def forget(ref: weakref.ref) -> None:
        entries = getattr(cache(), "_entries", {})
        if entries.get(key, (None,))[0] is ref:
            del entries[key]

    return forget
