"""FAR under DDP through the Trainer, the documented way: prime in one process, then torchrun from the switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_examples, tiny_model, torchrun
from test_trainer_callback import arguments

import far
from far.training.trainer import FARTrainer

pytestmark = pytest.mark.slow  # whole processes

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
def test_prime_in_one_process_then_train_on_under_torchrun(tmp_path):
    # 1. One process: prime, switch, save a checkpoint at the switch and stop.
    primed_dir = tmp_path / "primed"
    callback = far.FARCallback(retention=0.5, priming=2, stop_at_switch=True)
    trainer = FARTrainer(
        model=tiny_model("bert"), args=arguments(primed_dir), train_dataset=tiny_examples(), callbacks=[callback]
    )
    trainer.train()
    switch = primed_dir / "checkpoint-2"
    assert trainer.state.global_step == 2 and (switch / "far_layout.safetensors").is_file()

    # 2. torchrun: the same callback, resumed from the switch; the model is reconfigured before DDP wraps it.
    report = tmp_path / "report.json"
    torchrun(WORKER, "trainer", str(report), str(switch), str(tmp_path / "ddp"), cwd=tmp_path)
    result = json.loads(report.read_text())
    assert result["world_size"] == 2 and result["wrapped_in_ddp"] and result["steps"] == 6
    assert result["ranks_saw_different_batches"]  # different data per rank ...
    assert result["replicas_identical"]  # ... yet DDP kept the replicas equal
    assert result["frozen_unchanged"] and result["n_frozen"] > 0
    assert result["learners_moved"] and result["n_learner_tensors"] > 0

    # What rank 0 saved: the same learners as at the switch, the frozen nodes still at the switch's values.
    at_switch, final = far.from_pretrained(switch), far.from_pretrained(tmp_path / "ddp" / "final")
    assert all(torch.equal(far.learners(at_switch)[k], v) for k, v in far.learners(final).items())
    before = dict(at_switch.named_parameters())
    for name, p in final.named_parameters():
        if name.endswith(("frozen_weight", "frozen_bias")):
            assert torch.equal(p, before[name]), name
        elif name.endswith("learner_weight"):
            assert not torch.equal(p, before[name]), name
