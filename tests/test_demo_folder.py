"""`far demo` claims its output folder as every training command does: refused when it holds a run, `--overwrite`."""

from __future__ import annotations

import json

from far.cli.main import main


def _demo_outputs(folder):
    (folder / "merged").mkdir(parents=True)
    (folder / "merged" / "model.safetensors").write_bytes(b"x")
    (folder / "learners.safetensors").write_bytes(b"x")
    (folder / "notes.txt").write_text("mine")


def test_demo_refuses_a_folder_that_holds_a_run(data_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    _demo_outputs(out)
    # A model that does not exist: the refusal must come before anything loads.
    argv = ["demo", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(tmp_path / "no-model")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err, err
    assert (out / "learners.safetensors").read_bytes() == b"x" and (out / "merged" / "model.safetensors").is_file()


def test_demo_overwrite_removes_the_demo_outputs_only(data_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    _demo_outputs(out)
    argv = ["demo", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(tmp_path / "no-model")]
    main([*argv, "--overwrite"])  # goes past the folder, then fails on the missing model
    assert "already holds" not in capsys.readouterr().err
    assert not (out / "learners.safetensors").exists() and not (out / "merged").exists()
    assert (out / "notes.txt").read_text() == "mine"  # what the demo did not write stays
    assert json.loads((out / "run.json").read_text())["method"] == "demo"


def test_demo_help_lists_overwrite(capsys):
    assert main(["demo", "--help"]) == 0
    assert "--overwrite" in capsys.readouterr().out
