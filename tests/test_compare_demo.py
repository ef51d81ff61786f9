"""The demo's side-by-side helpers (`far.recipes.compare`) on a tiny model, and `far demo` end to end, briefly."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_batch, tiny_model
from safetensors.torch import load_file

import far
from far.cli.main import main
from far.evaluation.labels import TextMetric
from far.recipes.compare import cpu_timed, majority_baseline, paired_step_times, save_trained_tensors


def test_majority_baseline():
    majority, metrics = majority_baseline([1, 0, 1, 1], TextMetric("classification"))
    assert majority == 1 and metrics["accuracy"] == 0.75
    with pytest.raises(ValueError, match="at least one label"):
        majority_baseline([], TextMetric("classification"))


def test_paired_step_times_leave_the_models_alone():
    full = tiny_model("bert", num_labels=2)
    split = far.reconfigure(tiny_model("bert", num_labels=2), far.FARConfig(0.5, "random", freeze_embeddings=True))
    before = {k: v.clone() for k, v in full.state_dict().items()}
    batch = {**tiny_batch(), "labels": torch.tensor([0, 1, 0])}
    times = paired_step_times({"full": full, "far": split}, batch, rounds=3, warmup=1)
    assert [len(t) for t in times.values()] == [3, 3] and all(s > 0 for t in times.values() for s in t)
    assert all(torch.equal(before[k], v) for k, v in full.state_dict().items())


def test_cpu_timed_returns_the_result_and_the_seconds():
    result, seconds = cpu_timed(lambda: sum(i * i for i in range(200_000)))
    assert result == sum(i * i for i in range(200_000)) and seconds > 0


def test_save_trained_tensors_writes_only_what_trains(tmp_path):
    model = far.freeze_layers(tiny_model("bert", num_labels=2), 1)
    path = save_trained_tensors(model, tmp_path / "trained.safetensors")
    written = load_file(path)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(written) == trained and not any("embeddings" in n or ".layer.0." in n for n in written)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to write"):
        save_trained_tensors(model, tmp_path / "none.safetensors")


@pytest.mark.slow
def test_demo_end_to_end(data_dir, minilm_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["demo", "--data-dir", str(data_dir), "--output-dir", str(tmp_path), "--max-train-samples", "128"]
    assert main([*argv, "--max-eval-samples", "32", "--timing-rounds", "1"]) == 0
    out = capsys.readouterr().out
    for line in ("majority-class baseline", "max |logit difference|", "of the merged model", "bit for bit"):
        assert line in out, out
    summary = out.split("== summary")[1]
    for arm in ("full fine-tuning", "FAR auto: ", "bottom 3 frozen, kept"):
        assert arm in summary, summary
    assert "grouped by length" in summary  # every arm batches sentences of similar lengths
    assert "FAR's default, its automatic configuration" in out
    assert (tmp_path / "bottom3" / "trained.safetensors").is_file()
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["configuration"]["name"] == "auto" and len(record["arms"]) == 3  # FAR's arm is the default
    assert (tmp_path / "learners.safetensors").stat().st_size < (
        tmp_path / "merged" / "model.safetensors"
    ).stat().st_size / 4
