"""What a run reports while it trains: a JSON-lines log, a progress bar and the peak memory."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from pathlib import Path

from tqdm.auto import tqdm

from far.storage.atomic import atomic_file, disk_full


class RunLog:
    """Writes one JSON object per line to `path` (nothing when `path` is None).

    A new run starts the file afresh. A run resumed from step `resume_step` keeps the lines up to
    that step (a killed run may have logged further) and goes on after them. Each line is flushed
    as it is written, so a killed run keeps every line up to its last step.
    """

    def __init__(self, path: str | Path | None, resume_step: int | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._file = None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "w"
        if resume_step is not None and self.path.is_file():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            # Step 0 is a record from before the first step (a causal LM's perplexity before training).
            kept = [line for line in lines if _step_of(line) in range(0, resume_step + 1)]
            with atomic_file(self.path) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            mode = "a"
        self._file = open(self.path, mode, encoding="utf-8")  # closed by close()

    def write(self, record: dict) -> None:
        """Append `record` as a line, flushed.

        Raises:
            DiskFull: the disk has no room for the line; the lines before it are intact.
        """
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(record, sort_keys=False) + "\n")
            self._file.flush()
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            file, self._file = self._file, None
            with contextlib.suppress(OSError):  # its buffer holds the line the disk refused: close() would retry it
                file.close()
            free = shutil.disk_usage(self.path.parent).free
            raise disk_full(
                self.path.parent,
                f"writing {self.path.name} needed more than the {free:,} bytes free there",
                "Its lines up to the last whole one are intact",
            ) from error

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a kill


def progress_bar(total: int, initial: int, enabled: bool) -> tqdm:
    """A bar over the run's steps; tqdm shows steps/s, the loop adds the loss and the phase."""
    return tqdm(total=total, initial=initial, disable=not enabled, desc="far.finetune", unit="step", dynamic_ncols=True)
