"""A run's output folder: claimed before anything loads, so that no run silently replaces another's results.

A run writes `run.json` (what it is: task, model, method, optimizer) into its folder first. A later
run into a folder that holds a run refuses before it loads a model, naming the run that is there;
`overwrite` removes that run's files first (and only those: a folder given by hand may hold other
things), and `resume` continues only the run the folder is: the same task, model, method and optimizer.
A folder therefore never pairs one run's model with another run's metrics.

    >>> out = claim_output_dir(Path("runs/sst2-minilm-far"), run_identity(settings, "sst2"), resume=False)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from far.storage import lock
from far.storage.atomic import atomic_file

RUN_FILE = "run.json"
# What a run writes into its folder: these mark a folder as holding a run, and go with --overwrite.
RUN_OUTPUTS = (
    RUN_FILE,
    "metrics.json",
    "result.json",
    "log.jsonl",
    "train.log",
    "checkpoints",
    "model",
    "learners.safetensors",
    "adapter",
    "trained.safetensors",
    "predictions.tsv",
    "predictions.json",
)
IDENTITY_KEYS = ("task", "model", "method", "optimizer")


def describe(identity: Mapping) -> str:
    """e.g. "task sst2, model minilm, method far, optimizer mezo"."""
    return ", ".join(f"{key} {identity.get(key, '?')}" for key in IDENTITY_KEYS)


def existing_run(folder: Path) -> dict | None:
    """What run `folder` holds: its `run.json` (with "finished"), a run of an older far (unknown identity), or None."""
    if not folder.is_dir():
        return None
    present = [name for name in RUN_OUTPUTS if (folder / name).exists()]
    if not present:
        return None
    try:
        identity = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        identity = {}  # an older run, or a damaged run.json: what it was is unknown
    return {**identity, "finished": (folder / "metrics.json").is_file()}


def check_output_dir(folder: Path, identity: Mapping, *, resume: bool, overwrite: bool = False) -> dict | None:
    """Refuse (ValueError), changing nothing, unless `folder` may take this run; returns the run it holds.

    The folder is held for this process first (`far.storage.lock`): a run started into it from another
    process at the same moment is refused (`FolderInUse`), naming this one. `identity` is the run's
    `IDENTITY_KEYS` (`RunSettings.run_identity`); `resume` continues the run in `folder`, which must be this one;
    `overwrite` replaces it.
    """
    lock.hold(folder)
    held = existing_run(folder)
    if held is None and resume:
        raise ValueError(f"--resume continues a run, and {folder} holds none: drop --resume to start one there")
    if held is not None and resume:
        known = all(key in held for key in IDENTITY_KEYS)
        if known and any(held[key] != identity[key] for key in IDENTITY_KEYS):
            raise ValueError(
                f"--resume continues the run in {folder}, which is a run of {describe(held)}; this one is "
                f"{describe(identity)}: give the same options, or another --output-dir"
            )
        return held
    if held is not None and not overwrite:
        state = "a finished run" if held["finished"] else "an unfinished run"
        what = describe(held) if any(key in held for key in IDENTITY_KEYS) else "made by an earlier far"
        raise ValueError(
            f"{folder} already holds {state} ({what}); nothing was changed. Choose another --output-dir, add "
            "--overwrite to replace it" + ("" if held["finished"] else ", or --resume to continue it")
        )
    return held


def claim_output_dir(folder: Path, identity: Mapping, *, resume: bool, overwrite: bool = False) -> Path:
    """Make `folder` this run's (`check_output_dir` first): with `overwrite`, the run it holds is removed (its
    files only: a folder given by hand may hold other things); `run.json` then says which run it is."""
    held = check_output_dir(folder, identity, resume=resume, overwrite=overwrite)
    if resume:
        return folder
    if held is not None:
        for name in RUN_OUTPUTS:
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / RUN_FILE) as tmp:
        record = {**{key: identity[key] for key in IDENTITY_KEYS}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return folder
