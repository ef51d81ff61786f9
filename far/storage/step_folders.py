"""A run's numbered step folders, written whole and found newest first: the convention every checkpoint format keeps.

    <output_dir>/checkpoints/step-<N>/   one step's files, and manifest.json: the size and sha256 of each
    <output_dir>/checkpoints/latest      the name of the newest complete step folder

A folder appears whole (`far.storage.atomic.atomic_dir`) and `latest` moves only once it has, so a process killed at
any moment leaves the previous checkpoint intact; the manifest tells a damaged folder from an intact one. What goes
inside is the caller's (`far.training.checkpoint`, `far.llm.lean_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from far.storage.atomic import atomic_dir, atomic_file, file_sha256

CHECKPOINTS, LATEST, MANIFEST = "checkpoints", "latest", "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
logger = logging.getLogger(__name__)


def write_step_folder(output_dir: str | Path, step: int, write: Callable[[Path], None], keep: int | None) -> Path:
    """`output_dir/checkpoints/step-<step>/` with what `write(folder)` puts there and its manifest, written whole;
    then `latest` names it and all but the newest `keep` step folders are removed (None keeps all).

    Returns:
        The step folder.
    """
    root = Path(output_dir) / CHECKPOINTS
    target = root / f"step-{step}"
    with atomic_dir(target) as tmp:
        write(tmp)
        files = sorted(f.name for f in tmp.iterdir() if f.name != MANIFEST)
        manifest = {name: {"bytes": (tmp / name).stat().st_size, "sha256": file_sha256(tmp / name)} for name in files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    with atomic_file(root / LATEST) as tmp:
        tmp.write_text(target.name)
    if keep is not None:
        old = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p != target)
        for _, path in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(path, ignore_errors=True)
    return target


def step_folders(root: Path) -> list[Path]:
    """The step folders under a `checkpoints` folder, newest first, the one `latest` names leading; [] if none."""
    if not root.is_dir():
        return []
    folders = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()), reverse=True
    )
    ordered = [p for _, p in folders]
    pointer = root / LATEST
    if pointer.is_file():
        latest = root / pointer.read_text().strip()
        ordered = [latest] + [p for p in ordered if p != latest]
    return ordered


def manifest_problem(folder: Path, *, required: bool) -> str | None:
    """What a step folder is if its files do not match its manifest ("corrupted (...)", ...), else None.

    Args:
        required: Whether a folder without manifest.json is incomplete; folders of formats older than the manifest
            have none, and only their files' presence can be checked (by the caller).
    """
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"incomplete (no {MANIFEST})" if required else None
    try:
        entries = json.loads(manifest.read_text())
    except ValueError:
        return f"unreadable (its {MANIFEST} is not JSON)"
    for name, entry in entries.items():
        file = folder / name
        if not file.is_file() or file.stat().st_size != entry["bytes"] or file_sha256(file) != entry["sha256"]:
            return f"corrupted ({name} does not match its size and sha256 in {MANIFEST})"
    return None


def newest_intact(root: Path, problem: Callable[[Path], str | None]) -> tuple[Path | None, list[str]]:
    """The newest step folder under `root` in which `problem(folder)` finds nothing wrong (None if there is none),
    and what it found in each newer one; skipping damaged ones logs a warning."""
    problems = []
    for folder in step_folders(root):
        found = problem(folder)
        if found is None:
            if problems:
                logger.warning("skipping damaged checkpoints (%s); resuming from %s", "; ".join(problems), folder)
            return folder, problems
        problems.append(f"{folder.name}: {found}")
    return None, problems
