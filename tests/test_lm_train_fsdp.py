"""A lean causal LM trained with its AdamW state shared out over 2 CPU processes (torchrun, gloo; `--distributed
fsdp`, `far.llm.owned_adamw`): one process's weights on the same global batches, each process holding its share of
AdamW's moments, checkpoints that go on under either."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import torchrun
from lm_fsdp_worker import train
from test_lm_train import write_tiny_gguf
from test_lm_train_ddp import trained

from far.cli.main import main
from far.llm.owned_adamw import OwnedAdamW, owners
from far.recipes.settings import RunSettings
from far.training.adamw import FusedAdamW
from far.training.distributed import Parallel

WORKER = Path(__file__).with_name("lm_fsdp_worker.py")
TOLERANCE = 1e-5
distributed = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed in this build")


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_owners_balance_the_values_and_agree_everywhere():
    assert owners([10, 40, 30, 20], 2) == [0, 0, 1, 1]  # 40 + 10 against 30 + 20
    assert owners([5, 5, 5], 1) == [0, 0, 0]
    assert owners([7], 3) == [0]


def test_a_process_loads_the_moments_of_its_own_tensors_only():
    params = [torch.zeros(n) for n in (6, 2, 3)]  # owners [0, 1, 1] over 2 processes
    whole = FusedAdamW(params, lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    whole.step()
    for rank, held in ((0, [0]), (1, [1, 2])):
        adamw = OwnedAdamW(params, Parallel(rank, 2), lr=1e-2)  # loading exchanges nothing: no process group
        adamw.load_state_dict(whole.state_dict())
        assert [i for i, p in enumerate(params) if p in adamw.adamw.state] == held
        assert adamw.held_values() == 2 * sum(params[i].numel() for i in held)


def test_the_command_line_shards_a_causal_lm_with_adamw_and_refuses_mezo_with_the_reason():
    assert RunSettings(model="smollm2-135m", optimizer="adamw", distributed="fsdp").shards
    for optimizer in ("mezo", "zo-batched"):
        with pytest.raises(ValueError, match=r"MeZO cannot run sharded.*use --distributed ddp"):
            RunSettings(model="smollm2-135m", optimizer=optimizer, distributed="fsdp")


@pytest.mark.slow
@distributed
def test_two_processes_sharing_adamw_state_train_as_one_and_each_hold_their_share(tmp_path):
    model, steps = train(Parallel())
    one = {n: m.stored.detach() for n, m in model.named_modules() if getattr(m, "trainable", False)}
    whole_state = steps.state()
    torch.save(whole_state, tmp_path / "whole.pt")
    torchrun(WORKER, str(tmp_path), str(tmp_path / "whole.pt"), cwd=tmp_path)
    ranks = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in range(2)]

    for rank in ranks:
        assert gap(one, rank["trained"]) <= TOLERANCE
        assert rank["frozen_unmoved"]
    # Each process holds AdamW's moments of the tensors it owns, and only those: together, one process's.
    sizes = [p.numel() for p in steps.gradients.parameters()]
    shares = [2 * sum(n for n, r in zip(sizes, owners(sizes, 2), strict=True) if r == rank) for rank in range(2)]
    assert [rank["held"] for rank in ranks] == shares == [rank["held_after_load"] for rank in ranks]
    alone = sum(entry[k].numel() for entry in whole_state["state"].values() for k in ("exp_avg", "exp_avg_sq"))
    assert sum(shares) == alone and all(0 < s < alone for s in shares)
    assert max(shares) - min(shares) <= 2 * max(sizes)
    # The first process's state is whole (the owners' moments gathered), as one process's.
    gathered = ranks[0]["state"]
    assert gathered["param_groups"] == whole_state["param_groups"]
    assert gathered["state"].keys() == whole_state["state"].keys()
    for i, entry in whole_state["state"].items():
        assert float(gathered["state"][i]["step"]) == float(entry["step"]) == 3
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(gathered["state"][i][key], entry[key], rtol=1e-4, atol=1e-7)


def go_back_to(run: Path, copy: Path, step: int) -> Path:
    """A copy of the run `run` as it was when it wrote the checkpoint of step `step`, its later ones gone."""
    shutil.copytree(run, copy)
    for folder in (copy / "checkpoints").glob("step-*"):
        if folder.name != f"step-{step}":
            shutil.rmtree(folder)
    (copy / "checkpoints" / "latest").write_text(f"step-{step}")
    for name in ("metrics.json", "learners.safetensors"):
        (copy / name).unlink(missing_ok=True)
    return copy


@pytest.mark.slow
@distributed
def test_far_train_sharded_on_texts_ends_as_one_process_and_resumes_across_process_counts(tmp_path, monkeypatch, notes):
    gguf = write_tiny_gguf(tmp_path, monkeypatch)  # its tokenizer's cache folder goes to torchrun's processes too
    arguments = ["train", "--model", str(gguf), "--train-file", str(notes), "--optimizer", "adamw"]
    arguments += ["--lr", "3e-2", "--trainable-dtype", "float32", "--max-steps", "7", "--batch-size", "3"]
    arguments += ["--max-length", "32", "--checkpoint-every", "3", "--no-progress"]  # FAR's automatic configuration
    sharded = [*arguments, "--distributed", "fsdp"]
    assert main([*arguments, "--output-dir", str(tmp_path / "one")]) == 0
    torchrun("-m", "far.cli.main", *sharded, "--output-dir", str(tmp_path / "two"), cwd=tmp_path)
    one, two = trained(tmp_path / "one", 6), trained(tmp_path / "two", 6)
    assert gap(one, two) <= TOLERANCE
    # The checkpoint holds AdamW's moments whole, written once.
    states = [tmp_path / run / "checkpoints" / "step-6" / "state.pt" for run in ("one", "two")]
    moments = [torch.load(path, weights_only=True)["optimizer"] for path in states]
    assert moments[0]["state"].keys() == moments[1]["state"].keys()
    for i, entry in moments[0]["state"].items():
        torch.testing.assert_close(moments[1]["state"][i]["exp_avg"], entry["exp_avg"], rtol=1e-3, atol=1e-7)

    # A one-process checkpoint resumed sharded, a sharded one resumed sharded and in one process: the same weights.
    resumed = go_back_to(tmp_path / "one", tmp_path / "resumed", 3)
    torchrun("-m", "far.cli.main", *sharded, "--resume", "--output-dir", str(resumed), cwd=tmp_path)
    assert gap(one, trained(resumed, 6)) <= TOLERANCE
    again = go_back_to(tmp_path / "two", tmp_path / "again", 3)
    torchrun("-m", "far.cli.main", *sharded, "--resume", "--output-dir", str(again), cwd=tmp_path)
    assert gap(one, trained(again, 6)) <= TOLERANCE
    back = go_back_to(tmp_path / "two", tmp_path / "back", 3)
    assert main([*arguments, "--resume", "--output-dir", str(back)]) == 0
    assert gap(one, trained(back, 6)) <= TOLERANCE
