"""`far.finetune` sharded under torchrun (FSDP2, 2 CPU processes, gloo): the weights of one process taking the same
global batches, checkpoints that go on in either, and what a sharded run refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import torchrun
from ddp_finetune_worker import SHARDED_VARIANTS, run
from test_finetune_ddp import TOLERANCE, checkpoint_tensors, distributed, max_difference

from far.recipes.settings import RunSettings
from far.training.distributed import Parallel

WORKER = Path(__file__).with_name("ddp_finetune_worker.py")


@pytest.mark.slow
@distributed
def test_two_sharded_processes_train_as_one_and_resume_across_process_counts(tmp_path):
    one = run(tmp_path / "one", None).state_dict()
    torchrun(WORKER, str(tmp_path / "fsdp"), str(tmp_path / "one" / "checkpoints" / "step-3"), "fsdp", cwd=tmp_path)
    fresh, resumed, again = (
        torch.load(tmp_path / "fsdp" / name / "final.pt") for name in ("fresh", "resumed", "resumed-sharded")
    )
    assert max_difference(one, fresh) <= TOLERANCE
    assert max_difference(one, resumed) <= TOLERANCE  # a one-process checkpoint, resumed sharded
    assert max_difference(one, again) <= TOLERANCE  # a sharded checkpoint, resumed sharded
    for name, changes in SHARDED_VARIANTS.items():
        alone = run(tmp_path / f"one-{name}", None, **changes).state_dict()
        assert max_difference(alone, torch.load(tmp_path / "fsdp" / name / "final.pt")) <= TOLERANCE, name

    # The frozen nodes and embeddings did not move after the switch (step 2): as at the checkpoint of step 3.
    sharded_run = tmp_path / "fsdp" / "fresh"
    at_3, at_6 = checkpoint_tensors(sharded_run, 3), checkpoint_tensors(sharded_run, 6)
    frozen = [k for k in at_3 if k.endswith(("frozen_weight", "frozen_bias")) or "embeddings" in k]
    assert frozen and all(torch.equal(at_3[k], at_6[k]) for k in frozen)
    # The checkpoint holds whole tensors, as one process writes them, written once; it goes on in one process.
    assert at_3.keys() == checkpoint_tensors(tmp_path / "one", 3).keys()
    assert all(at_3[k].shape == v.shape for k, v in checkpoint_tensors(tmp_path / "one", 3).items())
    assert sorted(p.name for p in (sharded_run / "checkpoints").glob("step-*")) == ["step-3", "step-6"]
    again = run(tmp_path / "again", None, resume_from=sharded_run / "checkpoints" / "step-3").state_dict()
    assert max_difference(one, again) <= TOLERANCE


def test_a_sharded_run_refuses_mezo_and_micro_batches_and_says_what_to_use():
    sharded = Parallel(0, 2, shard=True)
    with pytest.raises(ValueError, match=r"MeZO cannot run sharded.*use --distributed ddp"):
        sharded.check_plan({"adamw", "mezo"}, micro_batches=False)
    with pytest.raises(ValueError, match=r"micro-batches cannot run sharded.*--distributed ddp"):
        sharded.check_plan({"adamw"}, micro_batches=True)
    Parallel(0, 2).check_plan({"mezo"}, micro_batches=True)  # replicated: both run
    Parallel(shard=True).check_plan({"mezo"}, micro_batches=True)  # one process: nothing is sharded


def test_the_command_line_refuses_sharded_mezo_and_an_unknown_mode():
    with pytest.raises(ValueError, match=r"MeZO cannot run sharded"):
        RunSettings(optimizer="mezo", distributed="fsdp")
    with pytest.raises(ValueError, match=r"distributed must be one of ddp, fsdp, got 'zero3'"):
        RunSettings(distributed="zero3")
