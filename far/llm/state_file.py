"""Tensors kept in a nameless scratch file instead of memory, read back on demand.

Reads go through `readinto` into a fresh tensor, never a mapping whose pages would count in the RSS.
The file has no name (`tempfile.TemporaryFile`), so its disk comes back when it is closed or the
process ends, killed or not. A write that finds the disk full takes back what it wrote (`DiskFull`).

    >>> with StateFile(out) as states:
    ...     states.put(b"key", h)
    ...     same = states.get(b"key")
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

import torch
from torch import Tensor

from far.storage.atomic import disk_full


class StateFile:
    """An append-only, nameless scratch file of tensors by key, taking its disk in `folder`."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        # Unbuffered: a write the disk refuses fails in `put`, not later in a flush that would lose the key.
        self._file = tempfile.TemporaryFile(dir=self.folder, buffering=0)  # noqa: SIM115 (close() ends it)
        self._where: dict[bytes, tuple[int, torch.Size, torch.dtype]] = {}
        self.bytes = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def put(self, key: bytes, tensor: Tensor) -> None:
        """Append `tensor` under `key` (a key already there keeps its first); `DiskFull` takes back a partial write."""
        if key in self._where:
            return
        data = tensor.detach().contiguous().cpu()
        view = memoryview(data.view(torch.uint8).numpy().reshape(-1))
        self._file.seek(self.bytes)
        try:
            done = 0
            while done < len(view):  # a raw write may take part of it
                done += self._file.write(view[done:])
        except OSError as error:
            self._file.truncate(self.bytes)
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            free = shutil.disk_usage(self.folder).free
            raise disk_full(
                self.folder,
                f"the frozen bottom's scratch file needed {data.nbytes:,} bytes more, {free:,} bytes are free there",
                "Nothing the run saved was changed",
            ) from error
        self._where[key] = (self.bytes, data.shape, data.dtype)
        self.bytes += data.nbytes

    def get(self, key: bytes) -> Tensor:
        """A new tensor holding what `put(key, ...)` wrote."""
        offset, shape, dtype = self._where[key]
        out = torch.empty(shape, dtype=dtype)
        self._file.seek(offset)
        view, done = memoryview(out.view(torch.uint8).numpy().reshape(-1)), 0
        while done < len(view):  # a raw read may return part of it (at most 2 GiB a call on Linux)
            got = self._file.readinto(view[done:])
            if not got:
                raise OSError(f"the scratch file in {self.folder} is shorter than what was written to it")
            done += got
        return out

    def close(self) -> None:
        self._file.close()
        self._where.clear()

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
