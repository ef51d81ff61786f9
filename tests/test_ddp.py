"""A reconfigured model under PyTorch DDP: 2 CPU processes (torchrun, gloo) stay identical, frozen weights still."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
def test_ddp_replicas_stay_identical_and_frozen_weights_do_not_move(tmp_path):
    report = tmp_path / "report.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        str(report),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(report.read_text())
    assert result["world_size"] == 2
    assert result["ranks_saw_different_losses"]  # different data per rank ...
    assert result["replicas_identical"]  # ... yet DDP kept the replicas equal
    assert result["frozen_unchanged"] and result["n_frozen"] > 0
    assert result["learners_moved"] and result["n_learner_tensors"] > 0
