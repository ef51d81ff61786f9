"""Where local data lives (--data-dir, else $FAR_DATA_DIR) and whether the hub may be used instead."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

DATA_DIR_ENV = "FAR_DATA_DIR"
_TRUE = {"1", "true", "yes", "on"}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local data root: `data_dir` if given, else $FAR_DATA_DIR, else None (meaning: use the hub).

    Raises:
        FileNotFoundError: the folder named does not exist (the message says which and how to fix it).
    """
    source = "--data-dir"
    if data_dir is None and os.environ.get(DATA_DIR_ENV):
        data_dir, source = os.environ[DATA_DIR_ENV], f"${DATA_DIR_ENV}"
    if data_dir is None:
        return None
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        shown = str(path) if path.is_absolute() else f"{path} (resolved to {path.resolve()})"
        raise FileNotFoundError(
            f"data dir {shown} (from {source}) does not exist; "
            f"point --data-dir or ${DATA_DIR_ENV} at a folder holding glue/<Task>/ and squad/ (or <Task>/ directly)"
        )
    return path


def hub_offline() -> bool:
    """True when HF_DATASETS_OFFLINE or HF_HUB_OFFLINE asks `datasets` not to reach the hub."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def not_found_message(what: str, looked: Sequence[Path], hint: str) -> str:
    """Say what was missing, every place looked, and how to point at data; mention the hub only when offline."""
    where = ", ".join(str(p) for p in looked) if looked else "nowhere: no --data-dir given and $FAR_DATA_DIR unset"
    offline = " (the hub is not an option: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set)" if hub_offline() else ""
    return f"no {what} found{offline}; looked in: {where}. {hint}"
