"""Atomic writes: a file or folder appears whole under its final name, or not at all; and a file's sha256.

A process killed mid-write leaves at most a temporary `*.tmp-*` sibling behind; the previous
version of the target stays intact, because the target is only ever replaced by a rename. A write
that fills its disk raises `DiskFull`, which names the disk and the bytes, after removing what it wrote.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read 1 MiB at a time (what checkpoints, exports and GGUF caches check)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes whenever a file's bytes do: any write moves its ctime, a new file is a new inode."""
    st = Path(path).stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class DiskFull(OSError):
    """A write that found its disk full: the partial write is gone, and the previous version is intact."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


# How the writers far calls say "disk full": Python's OSError, safetensors' (Rust) message, and torch.save's
# zip writer, which loses the errno ("unexpected pos", "file write failed") and is told by the free space left.
_FULL_MESSAGES = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
_NEARLY_FULL = 1 << 20  # bytes free below which a failed write is taken to have filled the disk


def _bytes_under(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def raise_if_disk_full(error: BaseException, target: Path, partial: Path) -> None:
    """Raise `DiskFull` (from `error`) where `error` came from a full disk while `partial` was written for `target`."""
    if isinstance(error, DiskFull) or not isinstance(error, Exception):
        return
    free = shutil.disk_usage(partial.parent if partial.parent.exists() else target.parent).free
    full = (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        text in str(error) for text in _FULL_MESSAGES
    )
    if not (full or free < _NEARLY_FULL):
        return
    written = _bytes_under(partial)
    raise disk_full(
        target.parent,
        f"writing {target.name} needed more than the {free + written:,} bytes free there",
        f"Nothing under {target} was changed (its previous version, if any, is intact)",
    ) from error


def disk_full(folder: Path, needed: str, kept: str) -> DiskFull:
    """The `DiskFull` of a write into `folder` that found no room: `needed` says what it needed, `kept` what is intact.

    Every full-disk message of far reads the same: the folder, its filesystem, the bytes, what survived, what to do.
    """
    folder = Path(folder)
    return DiskFull(
        errno.ENOSPC,
        f"the disk of {folder} (the filesystem at {_mount_point(folder)}) is full: {needed}. {kept}; free some "
        "space there, or write to another disk",
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed onto `path`.

    Example:
        >>> with atomic_file("model.safetensors") as tmp:
        ...     safetensors.torch.save_file(tensors, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as error:
        raise_if_disk_full(error, path, tmp)
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` by renames.

    An existing `path` is moved aside first and deleted only once the new folder is in place, so
    at every moment one complete version exists under `path` or under its `.old-*` sibling.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as error:
        raise_if_disk_full(error, path, tmp)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _json_safe(value: Any) -> Any:
    # NaN/inf (e.g. Pearson of constant predictions) are not JSON: write null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically (NaN and infinities become null, paths strings)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(_json_safe(obj), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
