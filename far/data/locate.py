"""Where local data lives (--data-dir, else $FAR_DATA_DIR) and whether the hub may be used instead."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

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


def find_local(data_dir: str | os.PathLike | None, folder: str, name: str, *, what: str, hint: str) -> Path | None:
    """`<root>/<folder>/<name>` or `<root>/<name>` under the local data root, whichever exists first.

    Returns None (and logs where it looked) when there is none and the hub may be used instead.

    Raises:
        FileNotFoundError: there is none and the hub is offline; the message says where it looked
            and `hint` how to point at the data.
    """
    root = resolve_data_dir(data_dir)
    looked = [root / folder / name, root / name] if root is not None else []
    found = next((p for p in looked if p.exists()), None)
    if found is None:
        if hub_offline():
            raise FileNotFoundError(not_found_message(what, looked, hint))
        logger.info(
            "no local %s (looked in %s); loading it from the hub", what, ", ".join(map(str, looked)) or "nowhere"
        )
    return found
