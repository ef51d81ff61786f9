"""A reconfigured model under PyTorch DDP: 2 CPU processes (torchrun, gloo) stay identical, frozen weights still."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # whole processes, real models or notebooks

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
    # A session of its own, so that a hang kills torchrun *and* its workers, and what they printed is shown.
    launcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        output, _ = launcher.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        output, _ = launcher.communicate()
        pytest.fail(f"torchrun still running after 180 s; killed. It printed:\n{output[-4000:]}")
    assert launcher.returncode == 0, f"torchrun failed:\n{output[-4000:]}"
    result = json.loads(report.read_text())
    assert result["world_size"] == 2
    assert result["ranks_saw_different_losses"]  # different data per rank ...
    assert result["replicas_identical"]  # ... yet DDP kept the replicas equal
    assert result["frozen_unchanged"] and result["n_frozen"] > 0
    assert result["learners_moved"] and result["n_learner_tensors"] > 0
