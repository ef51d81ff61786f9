"""Tensors kept in a scratch file instead of memory, read back on demand.

A text run with a frozen bottom reads each chunk's bottom output once a step (`far.llm.prefix`); kept
in memory, those states grow with the corpus (590 KB a chunk of 256 tokens for SmolLM2-135M), so the
in-memory cache is capped and what does not fit is computed again. Kept in a file they cost disk, not
resident memory: reads go through `readinto` into a fresh tensor, never through a mapping whose pages
would count in the process's RSS, and the page cache that holds recently read ones is the kernel's to
drop. Values come back bit for bit. The file has no name (`tempfile.TemporaryFile`): the disk it takes
is given back when it is closed or the process ends, killed or not, and nothing is left in the folder.

    >>> with StateFile(out) as states:
    ...     states.put(b"key", h)
    ...     same = states.get(b"key")
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType

import torch
from torch import Tensor


class StateFile:
    """An append-only, nameless scratch file of tensors by key.

    Args:
        folder: Where the file's disk is taken (the run's folder: on the disk the user chose).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self._file = tempfile.TemporaryFile(dir=self.folder)  # noqa: SIM115 (open for the run; close() ends it)
        self._where: dict[bytes, tuple[int, torch.Size, torch.dtype]] = {}
        self.bytes = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def put(self, key: bytes, tensor: Tensor) -> None:
        """Append `tensor` under `key` (a key already there keeps its first tensor)."""
        if key in self._where:
            return
        data = tensor.detach().contiguous().cpu()
        self._file.seek(self.bytes)
        self._file.write(memoryview(data.view(torch.uint8).numpy().reshape(-1)))
        self._where[key] = (self.bytes, data.shape, data.dtype)
        self.bytes += data.nbytes

    def get(self, key: bytes) -> Tensor:
        """A new tensor holding what `put(key, ...)` wrote."""
        offset, shape, dtype = self._where[key]
        out = torch.empty(shape, dtype=dtype)
        self._file.flush()
        self._file.seek(offset)
        raw = out.view(torch.uint8).numpy().reshape(-1)
        if self._file.readinto(memoryview(raw)) != out.nbytes:
            raise OSError(f"the scratch file in {self.folder} is shorter than what was written to it")
        return out

    def close(self) -> None:
        """Close the file, which gives its disk back."""
        self._file.close()
        self._where.clear()

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
