"""A causal LM export's training state back to far with `far export --from-executorch OUT --state FILE
--learners-only FILE`, and a user's learners continued on the device with `far export --model NAME --executorch OUT
--learners FILE`.

The refusals are quick: a hand-written manifest and state stand for an export (nothing of it is built), and every
refusal comes before the GGUF model loads. The round trips export a tiny Llama (tens of CPU seconds: the slow tier,
skipped without executorch); the runner's side is in tests/test_device_runner_lm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_device_lm import LENGTH, SLICE, chunks, lean_step
from test_llm_lean import tiny_hf, write_gguf
from test_lm_train import write_tiny_gguf

import far.llm.next_token as next_token
from far.cli.main import main
from far.device.lm_export import reconfigure_for_export, reconfigure_from_learners
from far.device.lm_programs import LMPrograms
from far.device.manifest import MANIFEST, NEXT_TOKEN, read_manifest
from far.device.state import DeviceState, read_state, write_state
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import load_learners
from far.llm.lean_saving import save_trained
from far.saving.safetensors_file import LEARNERS_FILE

TRAINABLE = [{"name": "layers.1.input_layernorm.stored", "shape": [4], "dtype": "float32"}]


def manifest(train_sha: str = "1" * 64) -> dict:
    """A causal LM export's manifest, as far as the state's readers look (no program behind it)."""
    programs = {
        "train": {"file": "train.pte", "sha256": train_sha},
        "bottom": {"file": "bottom.pte", "sha256": "2" * 64},
    }
    return {
        "format": "far.device",
        "format_version": 2,
        "objective": NEXT_TOKEN,
        "programs": programs,
        "batch_size": 2,
        "max_length": 8,
        "vocab_size": 97,
        "optimizer": {"name": "adamw"},
        "frozen_layers": 1,
        "lean_config": {},
        "base": {"gguf": "tiny.gguf", "sha256": "3" * 64},
        "base_fingerprint": "3" * 64,
        "trainable": TRAINABLE,
    }


@pytest.fixture
def export(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps(manifest()))
    write_state(
        tmp_path / "state.safetensors", DeviceState({"layers.1.input_layernorm.stored": torch.ones(4)}), manifest()
    )
    return out


def convert(tmp_path: Path, *flags: str, out: str = "out", state: str = "state.safetensors") -> list[str]:
    return ["export", "--from-executorch", str(tmp_path / out), "--state", str(tmp_path / state), *flags]


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_a_damaged_or_foreign_state_is_refused_before_anything_is_written(export, tmp_path, capsys):
    learners = ["--learners-only", str(tmp_path / "user.safetensors"), "--model", str(tmp_path / "tiny.gguf")]
    state = tmp_path / "state.safetensors"
    whole = state.read_bytes()
    state.write_bytes(whole[: len(whole) - 3])
    assert "truncated or damaged" in refused(convert(tmp_path, *learners), capsys)
    state.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    assert "is damaged" in refused(convert(tmp_path, *learners), capsys)
    write_state(state, DeviceState({"layers.1.input_layernorm.stored": torch.ones(4)}), manifest("9" * 64))
    assert "another training program" in refused(convert(tmp_path, *learners), capsys)
    write_state(state, DeviceState({"layers.1.post_attention_layernorm.stored": torch.ones(4)}), manifest())
    assert "other tensors than the manifest's" in refused(convert(tmp_path, *learners), capsys)
    write_state(state, DeviceState({"layers.1.input_layernorm.stored": torch.ones(5)}), manifest())
    assert "the manifest says [4]" in refused(convert(tmp_path, *learners), capsys)
    assert not (tmp_path / "user.safetensors").exists()


def test_a_folder_that_is_no_causal_lm_export_is_refused(export, tmp_path, capsys):
    learners = ["--learners-only", str(tmp_path / "user.safetensors")]
    (tmp_path / "plain").mkdir()
    assert "not an ExecuTorch export folder" in refused(convert(tmp_path, *learners, out="plain"), capsys)
    (export / MANIFEST).write_text(json.dumps({**manifest(), "objective": "classification"}))
    err = refused(convert(tmp_path, *learners), capsys)
    assert "trains a sequence classifier's labels" in err and "causal LM's next tokens" in err, err
    assert not (tmp_path / "user.safetensors").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--merge", "plain"], "add --learners-only FILE"),
        (["--learners-only", "user.safetensors", "--learners", "a.safetensors"], "--learners: not used with"),
        (["--learners-only", "state.safetensors"], "names the state file itself"),
        (["--learners-only", "out"], "is a folder; name a .safetensors file"),
        (["--learners-only", "user.safetensors"], "the export's base is tiny.gguf, no alias's GGUF file: name it"),
        (["--learners-only", "user.safetensors", "--model", "minilm"], "not a GGUF causal LM"),
    ],
)
def test_the_conversion_refuses_what_it_cannot_do_before_loading(export, tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    err = refused(convert(tmp_path, *flags), capsys)
    assert message in err, err
    assert not (tmp_path / "user.safetensors").exists()


def test_a_missing_state_and_state_flags_alone_are_refused(export, tmp_path, capsys):
    learners = ["--learners-only", str(tmp_path / "user.safetensors")]
    assert "needs --state FILE" in refused(convert(tmp_path, *learners, state="missing.safetensors"), capsys)
    argv = ["export", "--checkpoint", str(tmp_path), "--state", "s.safetensors", *learners]
    assert "use them with --from-executorch" in refused(argv, capsys)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama GGUF, and a text run's folder with the learners file of FAR on it (far train's layout, moved)."""
    folder = tmp_path_factory.mktemp("continued")
    with pytest.MonkeyPatch.context() as patch:
        gguf = write_tiny_gguf(folder, patch)
        model = load_lean_model(gguf)
        reconfigure_for_export(model, chunks(4, seed=5))
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for weight in model.trainable_weights():
                weight.stored.add_(torch.randn(weight.stored.shape, generator=generator) * 0.05)
        (folder / "run").mkdir()
        save_trained(model, folder / "run" / LEARNERS_FILE, base=gguf, values_dtype=torch.bfloat16)
        yield gguf, folder / "run"


def trained(gguf: Path, learners: Path) -> dict[str, torch.Tensor]:
    """Every weight of the stock model with `learners` applied."""
    model = load_learners(load_lean_model(gguf, torch.float32), learners)
    return {name: w.stored.detach().clone() for name, w in model.named_modules() if hasattr(w, "stored")}


@pytest.mark.slow
def test_an_export_from_a_text_run_goes_on_from_its_learners_and_comes_back(tiny, tmp_path, monkeypatch, capsys):
    pytest.importorskip("executorch")
    gguf, run = tiny
    monkeypatch.setattr(next_token, "VOCAB_SLICE", SLICE)
    out = tmp_path / "out"
    flags = ["--batch-size", "2", "--micro-batch-size", "2", "--max-length", str(LENGTH), "--lr", "0.01"]
    assert main(["export", "--model", str(gguf), "--executorch", str(out), "--learners", str(run), *flags]) == 0
    assert f"as {run / LEARNERS_FILE} holds them" in capsys.readouterr().out
    manifest = read_manifest(out, objective=NEXT_TOKEN)
    expected = load_lean_model(gguf)  # laid out from the same file, as the export reads it
    reconfigure_from_learners(expected, run / LEARNERS_FILE)
    assert manifest["frozen_layers"] == expected.lowest_trainable_layer() == 1
    nodes = {f"layers.{i}.mlp.down_proj": layer.mlp.learner_nodes.tolist() for i, layer in enumerate(expected.layers)}
    assert manifest["learners"] == nodes
    # the train program's trainable tensors: the file's values (bf16, exact in fp32)
    weights = {f"{name}.stored": w.stored for name, w in expected.named_modules() if hasattr(w, "stored")}
    state = read_state(out / "state.safetensors", manifest)
    stock = {f"{name}.stored": w.stored for name, w in load_lean_model(gguf).named_modules() if hasattr(w, "stored")}
    for name, value in state.tensors.items():
        assert torch.equal(value, weights[name]), name
    assert not all(torch.equal(v.bfloat16(), stock[n]) for n, v in state.tensors.items() if n in stock)  # not stock
    # the program's loss: the lean runtime's with the learners file applied to the stock model
    ids = chunks()
    device_loss, _ = LMPrograms(out, manifest).forward_backward({"input_ids": ids})
    assert abs(device_loss - lean_step(expected, ids)[0]) < 1e-4
    applied = load_learners(load_lean_model(gguf, torch.float32), run / LEARNERS_FILE)
    with torch.no_grad():
        assert abs(device_loss - float(applied.next_token_loss(ids))) < 1e-4
    # and back: the export's state as a learners file holds the run's values
    back = tmp_path / "back.safetensors"
    argv = ["export", "--from-executorch", str(out), "--state", str(out / "state.safetensors"), "--model", str(gguf)]
    assert main([*argv, "--learners-only", str(back)]) == 0
    assert "generate with it: far generate" in capsys.readouterr().out
    ours, theirs = trained(gguf, back), trained(gguf, run / LEARNERS_FILE)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


@pytest.mark.slow
def test_a_learners_file_of_another_base_is_refused(tiny, tmp_path, capsys):
    pytest.importorskip("executorch")  # without it the export is refused first, for the environment
    gguf, run = tiny
    other = tmp_path / "other.gguf"
    write_gguf(tiny_hf("llama", seed=1), other)  # the same shapes, other weights
    model = load_lean_model(other)
    reconfigure_for_export(model, None)
    save_trained(model, tmp_path / "theirs.safetensors", base=other)
    out = tmp_path / "out"
    argv = [
        "export",
        "--model",
        str(gguf),
        "--executorch",
        str(out),
        "--learners",
        str(tmp_path / "theirs.safetensors"),
    ]
    err = refused(argv, capsys)
    assert "was trained from other.gguf" in err and "not from this model's tiny.gguf" in err, err
    assert not out.exists()
