"""`far export` names what it exports when --checkpoint is not a model folder (e.g. a GGUF causal LM's run), and how
to get the device extra when --executorch finds no executorch."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import HAS_EXECUTORCH, tiny_model

import far
from far.cli.main import main


def _gguf_run(folder, trained_file):
    folder.mkdir()
    (folder / "run.json").write_text(
        json.dumps({"task": "notes", "model": "smollm2-135m", "method": "far", "optimizer": "adamw"})
    )
    (folder / "metrics.json").write_text("{}")
    (folder / trained_file).write_bytes(b"x")


@pytest.mark.parametrize("trained_file", ["learners.safetensors", "trained.safetensors"])
def test_a_causal_lms_run_is_named_with_what_export_supports(tmp_path, capsys, trained_file):
    run = tmp_path / "notes-smollm2-135m-far"
    _gguf_run(run, trained_file)
    assert main(["export", "--checkpoint", str(run), "--executorch", str(tmp_path / "device")]) == 2
    err = capsys.readouterr().err
    assert "GGUF causal LM's run (smollm2-135m)" in err, err
    assert "sequence classifiers of 'bert'" in err and "far generate --learners" in err, err
    assert not (tmp_path / "device").exists()


def test_a_folder_without_config_names_what_export_reads(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", "--checkpoint", str(tmp_path / "empty"), "--merge", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert "is not a model folder (no config.json in it)" in err and "runs/<task>-minilm-far/model" in err, err


@pytest.mark.skipif(HAS_EXECUTORCH, reason="executorch is installed here (as in .venv-device): the export runs")
def test_executorch_export_without_the_device_extra_names_how_to_get_it(tmp_path, capsys):
    model = tiny_model("bert", num_labels=2)
    far.reconfigure(model, far.FARConfig(retention=0.25, selection="random"))
    far.save_pretrained(model, tmp_path / "ckpt")
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--executorch", str(tmp_path / "device")]) == 2
    err = capsys.readouterr().err
    assert "--executorch needs executorch" in err and ".venv-device/bin/far" in err and "'.[device]'" in err, err
    assert "Traceback" not in err and not (tmp_path / "device").exists()


def test_a_causal_lm_export_without_the_device_extra_names_how_to_get_it(tmp_path, capsys, monkeypatch):
    import far.cli.export as export_command

    real = importlib.util.find_spec
    monkeypatch.setattr(
        export_command.importlib.util, "find_spec", lambda n, *a: None if n == "executorch" else real(n, *a)
    )
    (tmp_path / "notes.txt").write_text("the cat sat on the mat. " * 50)
    argv = ["export", "--model", "smollm2-135m", "--executorch", str(tmp_path / "device")]
    assert main([*argv, "--train-file", str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert "--executorch needs executorch" in err and ".venv-device/bin/far" in err, err
    assert not (tmp_path / "device").exists()
