"""One process at a time in a folder: an advisory lock beside it, which the kernel drops when the process ends.

`hold` takes an exclusive `flock` on `.<name>.lock` beside the folder (not inside: a folder written by renames
would carry it away) until the process ends or `release`. The kernel drops a flock with its last descriptor, so a
killed process leaves no stale lock. A second process is refused at once, before it changes anything, with the
holder's pid and command.

    >>> hold(Path("runs/sst2-minilm-far"))     # refuses (FolderInUse) while another process holds it
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; a folder is then held for this process only
    fcntl = None

# Descriptors this process holds, by folder: a lock is the process's own state by nature, and holding a
# folder twice (a check, then the claim) must not take a second lock the first would refuse.
_HELD: dict[Path, int] = {}


class FolderInUse(ValueError):
    """Another process holds the folder."""


def lock_path(folder: str | os.PathLike) -> Path:
    folder = Path(folder).resolve()
    return folder.parent / f".{folder.name}.lock"


def hold(folder: str | os.PathLike) -> None:
    """Hold `folder` for this process (re-entrant), or raise `FolderInUse` naming the process that holds it.

    Makes the folder's parent if missing (the lock file lives there); the folder itself is not touched.
    """
    key = Path(folder).resolve()
    if key in _HELD:
        return
    path = lock_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        for _ in range(20):  # the winner writes who it is just after it takes the lock
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            if holder:
                break
            time.sleep(0.01)
        os.close(fd)
        holder = holder or "another process"
        raise FolderInUse(
            f"{folder} is in use by {holder}; nothing was changed. Wait for that run to end, or choose another folder"
        ) from None
    os.ftruncate(fd, 0)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    os.pwrite(fd, f"pid {os.getpid()} ({command[:200]}), since {time.strftime('%H:%M:%S')}\n".encode(), 0)
    _HELD[key] = fd


def release(folder: str | os.PathLike) -> None:
    """Let other processes take `folder` (a no-op where this process does not hold it)."""
    fd = _HELD.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor drops the flock
