"""Checkpoints of far.finetune: layout, atomic writes, exact resume, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_examples, tiny_model

import far
from far.training import checkpoint as ckpt
from far.training.checkpoint import find_checkpoint, load_model_state, read_checkpoint

RUNS = {
    # AdamW with dropout (train mode), grad accumulation, warmup, weight decay: the RNG and the data
    # position must both be restored.
    "adamw": dict(
        optimizer="adamw", lr=1e-2, priming=2, max_steps=8, batch_size=4, grad_accum=2, warmup=2, weight_decay=0.1
    ),
    "mezo": dict(optimizer="mezo", lr=1e-2, priming=2, max_steps=8, batch_size=6, weight_decay=0.1, mezo_directions=2),
}


def run(kind: str, **kwargs) -> torch.nn.Module:
    model = tiny_model("bert")
    far.finetune(model, tiny_examples(20), progress=False, **(RUNS[kind] | kwargs))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["adamw", "mezo"])
def test_resume_reaches_the_same_weights(tmp_path, kind):
    whole = run(kind, output_dir=tmp_path / "a", checkpoint_every=4, keep_checkpoints=None)
    resumed = run(
        kind, output_dir=tmp_path / "b", checkpoint_every=4, resume_from=tmp_path / "a" / "checkpoints" / "step-4"
    )
    assert far.is_reconfigured(resumed) and far.learners(resumed).keys() == far.learners(whole).keys()
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        if kind == "mezo":
            assert torch.equal(a, b), name
        else:
            assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-6), name
    log = [json.loads(line) for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 6, 7, 8]


def test_checkpoint_layout_latest_and_pruning(tmp_path):
    model = run("adamw", max_steps=10, output_dir=tmp_path, checkpoint_every=3, keep_checkpoints=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-10", "step-9"]  # priming (2 steps) had none
    assert (root / "latest").read_text() == "step-10"
    folder = find_checkpoint(tmp_path)
    assert folder == root / "step-10" and find_checkpoint(root) == folder and find_checkpoint(folder) == folder
    c = read_checkpoint(tmp_path)
    assert c.step == 10 and c.far_config == far.get_config(model)
    assert set(c.trainable) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert c.trainer_state["plan"]["total_steps"] == 10
    assert not any(p.name.startswith(".") for p in root.iterdir())  # no temporary leftovers


def test_failed_write_never_breaks_the_latest_checkpoint(tmp_path, monkeypatch):
    real_save, calls = torch.save, []

    def flaky_save(obj, path, *args, **kwargs):  # dies inside the second checkpoint (step 6): 2 calls each
        calls.append(path)
        if len(calls) == 4:
            raise OSError("disk full")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", flaky_save)
    with pytest.raises(OSError, match="disk full"):
        run("mezo", output_dir=tmp_path, checkpoint_every=3)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-3"]
    assert read_checkpoint(tmp_path).step == 3
    # and the run goes on from it to the weights of an uninterrupted run
    resumed = run("mezo", resume_from=tmp_path)
    log = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log == list(range(1, 9))  # the lines the killed run wrote after step 3 were replaced
    whole = run("mezo")
    assert all(
        torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True)
    )


def test_load_model_state_rebuilds_the_layout_on_a_plain_model(tmp_path):
    model = run("adamw", output_dir=tmp_path, checkpoint_every=8)
    plain = tiny_model("bert", seed=5)
    load_model_state(plain, read_checkpoint(tmp_path))
    assert far.learners(plain).keys() == far.learners(model).keys()
    assert all(torch.equal(far.learners(plain)[k], v) for k, v in far.learners(model).items())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values(), strict=True))
    assert [p.requires_grad for p in plain.parameters()] == [p.requires_grad for p in model.parameters()]


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_is_refused_and_the_model_left_alone(tmp_path):
    run("adamw", output_dir=tmp_path, checkpoint_every=8)
    other = tiny_model("bert", num_labels=5)  # another classifier head
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="does not fit this model"):
        load_model_state(other, read_checkpoint(tmp_path))
    assert not far.is_reconfigured(other)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())


def test_resume_refusals(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint at"):
        far.finetune(tiny_model("bert"), tiny_examples(20), max_steps=4, resume_from=tmp_path, progress=False)
    run("mezo", output_dir=tmp_path / "a", checkpoint_every=4)
    with pytest.raises(ValueError, match=r"these differ: lr: saved 0.01, now 0.02"):
        far.finetune(
            tiny_model("bert"),
            tiny_examples(20),
            progress=False,
            resume_from=tmp_path / "a",
            **(RUNS["mezo"] | {"lr": 2e-2}),
        )
    (tmp_path / "a" / "checkpoints" / "step-8" / "rng.pt").unlink()
    with pytest.raises(ValueError, match=r"is incomplete \(missing rng.pt\)"):
        read_checkpoint(tmp_path / "a" / "checkpoints" / "step-8")  # that very one was asked for
    assert read_checkpoint(tmp_path / "a").step == 4  # from the run: the previous intact one
