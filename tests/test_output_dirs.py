"""No run silently replaces another's results: a folder that holds a run is refused before anything loads,
`--overwrite` replaces that run whole, and `--resume` continues only the run the folder is."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import write_rows

from far.cli.main import main
from far.recipes.outputs import RUN_FILE, claim_output_dir, existing_run
from far.recipes.settings import RunSettings

QUICK = ["--max-steps", "2", "--batch-size", "8", "--no-progress"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def files(tmp_path):
    rng = random.Random(0)
    rows = [{"text": rng.choice(["good fine", "bad dull"]), "label": rng.choice(["pos", "neg"])} for _ in range(16)]
    return write_rows(tmp_path / "train.csv", rows), write_rows(tmp_path / "dev.csv", rows[:6])


def train(files, model, out, *extra) -> int:
    return main(["train", "--train-file", str(files[0]), "--validation-file", str(files[1]), "--model", str(model),
                 "--output-dir", str(out), *QUICK, *extra])  # fmt: skip


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_default_folder_names_the_task_the_model_and_the_method():
    assert RunSettings(model="minilm", method="far").output_path("sst2") == Path("runs/sst2-minilm-far")
    assert RunSettings(model="smollm2-135m", method="far").output_path("sst2") == Path("runs/sst2-smollm2-135m-far")
    assert RunSettings(model="/models/my-bert/", method="full").output_path("cola") == Path("runs/cola-my-bert-full")
    assert RunSettings(output_dir="elsewhere").output_path("cola") == Path("elsewhere")


def test_a_second_run_into_a_finished_runs_folder_is_refused_and_changes_nothing(
    files, tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    assert train(files, tiny_model_dir, out, "--method", "far") == 0
    before = snapshot(out)
    capsys.readouterr()
    assert train(files, tiny_model_dir, out, "--method", "full") == 2
    err = capsys.readouterr().err
    assert "already holds a finished run" in err and "method far" in err and "--overwrite" in err, err
    assert snapshot(out) == before


@pytest.mark.slow
def test_overwrite_replaces_the_run_whole_and_leaves_other_files(files, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert train(files, tiny_model_dir, out, "--method", "far") == 0
    assert (out / "learners.safetensors").is_file()
    (out / "notes.txt").write_text("mine")
    assert train(files, tiny_model_dir, out, "--method", "full", "--overwrite") == 0
    assert not (out / "learners.safetensors").exists()  # the FAR run's file does not stay beside the full run
    assert json.loads((out / "metrics.json").read_text())["method"] == "full"
    assert json.loads((out / RUN_FILE).read_text())["method"] == "full"
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_resume_continues_only_its_own_run(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(files, tiny_model_dir, out, "--method", "far", "--checkpoint-every", "1") == 0
    capsys.readouterr()
    assert train(files, tiny_model_dir, out, "--method", "full", "--resume") == 2
    err = capsys.readouterr().err
    assert "--resume continues the run in" in err and "method far" in err, err
    assert train(files, tiny_model_dir, tmp_path / "empty", "--resume") == 2
    assert "holds none" in capsys.readouterr().err
    assert not (tmp_path / "empty").exists()


def test_a_folder_of_an_older_run_counts_as_a_run(tmp_path):
    (tmp_path / "metrics.json").write_text("{}")
    assert existing_run(tmp_path) == {"finished": True}
    identity = {"task": "cola", "model": "minilm", "method": "far", "optimizer": "adamw"}
    with pytest.raises(ValueError, match="made by an earlier far"):
        claim_output_dir(tmp_path, identity, resume=False)
    assert not (tmp_path / RUN_FILE).exists()
