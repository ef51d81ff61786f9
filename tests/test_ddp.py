"""A reconfigured model under PyTorch DDP: 2 CPU processes (torchrun, gloo) stay identical, frozen weights still."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import torchrun

pytestmark = pytest.mark.slow  # whole processes, real models or notebooks

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
def test_ddp_replicas_stay_identical_and_frozen_weights_do_not_move(tmp_path):
    report = tmp_path / "report.json"
    torchrun(WORKER, str(report), cwd=tmp_path, timeout=180)
    result = json.loads(report.read_text())
    assert result["world_size"] == 2
    assert result["ranks_saw_different_losses"]  # different data per rank ...
    assert result["replicas_identical"]  # ... yet DDP kept the replicas equal
    assert result["frozen_unchanged"] and result["n_frozen"] > 0
    assert result["learners_moved"] and result["n_learner_tensors"] > 0
