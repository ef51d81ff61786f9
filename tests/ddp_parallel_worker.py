"""Spawned by tests/test_finetune_ddp.py, two processes over gloo: what `Parallel` does when they disagree or fail.

A module of its own, light to import: each spawned process imports the module of the function it runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from far.training.distributed import Parallel


def disagree_and_fail(rank: int, store_path: str, report: str) -> None:
    """One of two spawned processes: scores that differ between them, then an error in the first one's `on_main`."""
    store = torch.distributed.FileStore(store_path, 2)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
    parallel, caught = Parallel(rank, 2), []
    try:
        parallel.check_same({"layers.0.mlp": torch.full((3,), float(rank))}, "priming scores")
    except RuntimeError as error:
        caught.append(str(error))
    try:
        parallel.on_main(lambda: (_ for _ in ()).throw(ValueError("no room on the disk")))
    except ValueError as error:  # the first process: its own error; the other: the PeerError naming it
        caught.append(f"{type(error).__name__}: {error}")
    Path(report, f"rank-{rank}.json").write_text(json.dumps(caught))
    parallel.close()
