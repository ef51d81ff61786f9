"""Where local data lives (--data-dir, else $FAR_DATA_DIR) and whether the hub may be used instead.

The command line also looks in one documented default, `../shared/data` from the current folder and then
from the far checkout (`locate_data_dir`); the library's loaders take only what they are given.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "FAR_DATA_DIR"
OFFLINE_ENVS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
# The command line's default data root, relative to the current folder and to the far checkout.
DEFAULT_DATA_DIR = Path("../shared/data")
# What a data root holds, as the command line's messages say it.
GLUE_LAYOUT = "glue/<Task>/train.tsv and dev.tsv (GLUE's download layout: glue/CoLA/, glue/SST-2/, glue/STS-B/, ...)"
SQUAD_LAYOUT = "squad/dev-v1.1.json"
DATA_LAYOUT = f"{GLUE_LAYOUT} or {SQUAD_LAYOUT}"
_TRUE = {"1", "true", "yes", "on"}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local data root: `data_dir` if given, else $FAR_DATA_DIR, else None (meaning: use the hub).

    Raises:
        FileNotFoundError: the folder named does not exist.
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


def _offline_envs() -> list[str]:
    return [name for name in OFFLINE_ENVS if os.environ.get(name, "").strip().lower() in _TRUE]


def hub_offline() -> bool:
    """True when HF_DATASETS_OFFLINE or HF_HUB_OFFLINE asks `datasets` not to reach the hub."""
    return bool(_offline_envs())


def default_data_dirs() -> list[Path]:
    """Where the command line looks without --data-dir or $FAR_DATA_DIR: `../shared/data` from the current
    folder, then from the far checkout (the folder with pyproject.toml that holds this package), resolved."""
    bases = [Path.cwd()]
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        bases.append(checkout)
    return list(dict.fromkeys((base / DEFAULT_DATA_DIR).resolve() for base in bases))


def locate_data_dir(
    data_dir: str | os.PathLike | None = None, *, needs: str = DATA_LAYOUT, hub: bool = True
) -> Path | None:
    """The command line's data root: `data_dir` (--data-dir), else $FAR_DATA_DIR, else the first of
    `default_data_dirs()` that holds glue/ or squad/; None when there is none and the hub (if `hub`) is to be
    tried. Called before anything loads, so that a run without data stops at once, saying what to pass
    (`needs`: the files the command reads under the root); FileNotFoundError when the hub is no option.
    """
    root = resolve_data_dir(data_dir)
    if root is not None:
        return root
    looked = default_data_dirs()
    found = next((p for p in looked if (p / "glue").is_dir() or (p / "squad").is_dir()), None)
    if found is not None:
        logger.info("data: %s (the default %s; --data-dir DIR or $%s to choose)", found, DEFAULT_DATA_DIR, DATA_DIR_ENV)
        return found
    missing = (
        f"no local data: --data-dir not given, ${DATA_DIR_ENV} unset, and no glue/ or squad/ in "
        + " or ".join(map(str, looked))
        + f" (the default {DEFAULT_DATA_DIR}, from the current folder and from the far checkout)"
    )
    what_to_pass = f"pass --data-dir DIR or export {DATA_DIR_ENV}=DIR, where DIR holds {needs}"
    if not hub:
        raise FileNotFoundError(f"{missing}, and this command reads local files only. To fix: {what_to_pass}.")
    offline = _offline_envs()
    if offline:
        raise FileNotFoundError(f"{missing}, and the hub is offline ({'/'.join(offline)} set). To fix: {what_to_pass}.")
    logger.warning("%s; trying the Hugging Face hub (without a network, %s)", missing, what_to_pass)
    return None


def find_local(data_dir: str | os.PathLike | None, folder: str, name: str, *, what: str, hint: str) -> Path | None:
    """`<root>/<folder>/<name>` or `<root>/<name>` under the local data root, whichever exists first; None (logged)
    when there is none and the hub may be used instead, FileNotFoundError (with `hint`) when the hub is offline."""
    root = resolve_data_dir(data_dir)
    looked = [root / folder / name, root / name] if root is not None else []
    found = next((p for p in looked if p.exists()), None)
    if found is None:
        if hub_offline():
            where = ", ".join(map(str, looked)) or "nowhere: no --data-dir given and $FAR_DATA_DIR unset"
            raise FileNotFoundError(
                f"no {what} found (the hub is not an option: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set); "
                f"looked in: {where}. {hint}"
            )
        logger.info(
            "no local %s (looked in %s); loading it from the hub", what, ", ".join(map(str, looked)) or "nowhere"
        )
    return found
