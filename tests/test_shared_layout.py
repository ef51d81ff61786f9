"""A layout primed once and shared: `far prime` / `prime_layout` writes what priming chose, and a run trained with
it (`far.finetune(layout=...)`, `far train --layout`) splits the model with those learners at step 0, no priming."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_examples, tiny_model
from conftest import write_rows as write
from safetensors import safe_open
from test_cli_train_predict import _rows

import far
from far.cli.main import main
from far.saving.shared_layout import LayoutFileError, read_shared_layout
from far.training import prime_layout

# Six layers: AdamW priming moves them nearly alike, so the automatic configuration freezes one of them.
RUN = dict(optimizer="adamw", lr=1e-2, max_steps=8, batch_size=6, priming=3, progress=False)


def deep(seed: int = 0, **overrides) -> torch.nn.Module:
    return tiny_model("bert", seed=seed, num_hidden_layers=6, **overrides)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def primed(tmp_path_factory) -> tuple[str, dict]:
    """A layout primed on the tiny base, and the learners an in-process run of the same options switched to."""
    in_process = deep()
    far.finetune(in_process, tiny_examples(), "auto", **RUN)
    path = tmp_path_factory.mktemp("layout") / "layout.safetensors"
    prime_layout(deep(), tiny_examples(), path, record={"task": "tiny"}, **RUN)
    return str(path), far.learners(in_process)


def test_priming_alone_chooses_what_the_run_would_switch_to(primed):
    path, switched = primed
    layout = read_shared_layout(path)
    assert same(dict(layout.learners), switched)
    assert layout.config == far.FARConfig.auto(freeze_layers=1) and layout.frozen_layers == 1
    assert layout.record["task"] == "tiny" and layout.record["priming_steps"] == 3


def test_a_run_with_the_layout_splits_at_step_zero_without_priming(primed, tmp_path):
    path, switched = primed
    model = deep()
    result = far.finetune(model, tiny_examples(seed=1), layout=path, output_dir=tmp_path / "run", **RUN)
    assert result.priming_steps == 0 and result.steps == RUN["max_steps"]
    assert same(far.learners(model), switched) and far.get_config(model) == read_shared_layout(path).config
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {line["phase"] for line in log} == {"training"} and "trainable_parameters" in log[0]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (lambda: deep(seed=1), "primed on another base"),
        (lambda: deep(intermediate_size=48), "does not fit this model's shape"),
        (lambda: tiny_model("bert", num_hidden_layers=2), "does not fit this model's shape"),
    ],
)
def test_a_layout_for_another_base_or_shape_is_refused_before_anything_changes(primed, tmp_path, model, message):
    path, _ = primed
    model = model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LayoutFileError, match=message):
        far.finetune(model, tiny_examples(), layout=path, output_dir=tmp_path / "run", **RUN)
    assert not (tmp_path / "run").exists() and not far.is_reconfigured(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_corrupted_or_foreign_layout_is_refused(primed, tmp_path):
    path, _ = primed
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # a learner index
    (tmp_path / "flipped.safetensors").write_bytes(bytes(data))
    with pytest.raises(LayoutFileError, match="corrupted"):
        read_shared_layout(tmp_path / "flipped.safetensors")
    (tmp_path / "cut.safetensors").write_bytes(bytes(data[:40]))
    with pytest.raises(LayoutFileError, match="not a readable safetensors file"):
        read_shared_layout(tmp_path / "cut.safetensors")
    model = far.reconfigure(deep(), 0.4, selection="random")
    far.saving.layout.write_layout(model, tmp_path)  # beside a model's weights: no base fingerprint to check
    with pytest.raises(LayoutFileError, match="layout to share with far prime"):
        read_shared_layout(tmp_path / far.saving.layout.LAYOUT_FILE)
    with pytest.raises(ValueError, match="the config given differs"):
        far.finetune(deep(), tiny_examples(), far.FARConfig(0.4), layout=path, **RUN)
    with pytest.raises(ValueError, match="exists; nothing was changed"):
        prime_layout(deep(), tiny_examples(), path, **RUN)


def test_cli_prime_then_train_with_the_layout(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    user0, user1, dev = (write(tmp_path / f"{n}.csv", _rows(24, seed)) for seed, n in enumerate(("u0", "u1", "dev")))
    run = ["--model", str(tiny_model_dir), "--max-steps", "6", "--batch-size", "4", "--priming", "2", "--no-progress"]
    layout = tmp_path / "layout.safetensors"
    assert main(["prime", "--train-file", str(user0), "--output", str(layout), *run]) == 0
    assert "primed 2 of 6 steps on 24 examples" in capsys.readouterr().out
    assert main(["prime", "--train-file", str(user0), "--output", str(layout), *run]) == 2  # no --overwrite
    assert "exists; nothing was changed" in capsys.readouterr().err
    out = tmp_path / "user1"
    train = ["train", "--train-file", str(user1), "--validation-file", str(dev), "--output-dir", str(out), *run]
    assert main([*train, "--layout", str(layout), "--retention", "0.4"]) == 2  # the layout sets the surgery
    assert "drop --retention" in capsys.readouterr().err and not out.exists()
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(layout.read_bytes()[:-1] + bytes([layout.read_bytes()[-1] ^ 1]))
    assert main([*train, "--layout", str(flipped)]) == 2
    assert "corrupted" in capsys.readouterr().err and not out.exists()
    assert main([*train, "--layout", str(layout)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    digest = read_shared_layout(layout).digest
    assert metrics["priming_steps"] == 0 and metrics["configuration"]["name"] == "layout"
    assert metrics["configuration"]["layout"] == {"path": str(layout), "digest": digest}
    with safe_open(str(out / "learners.safetensors"), framework="pt") as f:
        assert f.metadata()["layout_sha256"] == digest
    far.load_learners(far.from_pretrained(out / "model"), out / "learners.safetensors")  # still a learners file
