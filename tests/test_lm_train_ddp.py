"""`far train` on texts with a lean causal LM under torchrun (2 CPU processes, gloo): one process's weights."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import torchrun
from test_lm_train import write_tiny_gguf

from far.cli.main import main

pytestmark = pytest.mark.slow  # whole processes


def trained(run, step: int) -> dict[str, torch.Tensor]:
    """The trained weights of the checkpoint of step `step` (the lean runtime's checkpoint: full precision)."""
    state = torch.load(run / "checkpoints" / f"step-{step}" / "state.pt", weights_only=True)
    return state["weights"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.parametrize("optimizer", ["adamw", "mezo"])
def test_two_processes_train_texts_as_one(tmp_path, monkeypatch, notes, optimizer):
    gguf = write_tiny_gguf(tmp_path, monkeypatch)  # its tokenizer's cache folder goes to torchrun's processes too
    arguments = ["train", "--model", str(gguf), "--train-file", str(notes), "--optimizer", optimizer]
    arguments += ["--lr", "3e-2" if optimizer == "adamw" else "3e-3", "--trainable-dtype", "float32"]
    arguments += ["--max-steps", "5", "--batch-size", "3", "--max-length", "32", "--checkpoint-every", "4"]
    arguments += ["--no-progress"]
    assert main([*arguments, "--output-dir", str(tmp_path / "one")]) == 0
    torchrun("-m", "far.cli.main", *arguments, "--output-dir", str(tmp_path / "two"), cwd=tmp_path)

    one, two = trained(tmp_path / "one", 4), trained(tmp_path / "two", 4)
    assert one.keys() == two.keys() and one  # the same learners in both runs
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-5
    records = [json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two")]
    assert records[0].keys() == records[1].keys() and records[0]["steps"] == records[1]["steps"] == 5
    assert records[0]["metrics"]["perplexity"] == pytest.approx(records[1]["metrics"]["perplexity"], rel=1e-4)
    logs = [
        [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        for name in ("one", "two")
    ]
    assert [line["step"] for line in logs[0]] == [line["step"] for line in logs[1]]
    steps = [(a, b) for a, b in zip(*logs, strict=True) if "loss" in a]  # the line of step 0 holds the scores only
    assert len(steps) == 5 and all(a["loss"] == pytest.approx(b["loss"], rel=1e-5) for a, b in steps)
