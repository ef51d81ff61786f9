"""`far train --checkpoint-every N --resume`: a run killed with SIGKILL goes on to the uninterrupted run's end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import write_rows as write
from safetensors.torch import load_file
from test_cli_train_predict import _rows

from far.cli.main import main


def _argv(tiny_model_dir, train, dev, out, *extra) -> list[str]:
    return [
        "train", "--train-file", str(train), "--validation-file", str(dev), "--model", str(tiny_model_dir),
        "--output-dir", str(out), "--max-steps", "12", "--batch-size", "4", "--priming", "3",
        "--checkpoint-every", "1", "--no-progress", "--retention", "0.5", *extra,
    ]  # fmt: skip


def _start(argv: list[str]) -> subprocess.Popen:
    # Every run in a process of its own, with one thread: bitwise equality needs the same summation order.
    code = f"import sys; from far.cli.main import main; sys.exit(main({argv!r}))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _run(argv: list[str]) -> None:
    child = _start(argv)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err.decode()[-2000:]


@pytest.mark.slow
def test_a_killed_cli_run_resumes_to_the_same_learners_file(tiny_model_dir, tmp_path):
    train, dev = write(tmp_path / "t.csv", _rows(48, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    _run(_argv(tiny_model_dir, train, dev, tmp_path / "whole"))

    killed = tmp_path / "killed"
    child = _start(_argv(tiny_model_dir, train, dev, killed))
    deadline = time.monotonic() + 120
    while not list((killed / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)  # somewhere after the first checkpoint, mid-step or mid-write
    child.wait()
    assert not (killed / "metrics.json").exists()

    _run(_argv(tiny_model_dir, train, dev, killed, "--resume"))
    whole, resumed = (load_file(p / "learners.safetensors") for p in (tmp_path / "whole", killed))
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    metrics = [json.loads((p / "metrics.json").read_text())["metrics"] for p in (tmp_path / "whole", killed)]
    assert metrics[0] == metrics[1]


def test_resume_refusals_say_what_to_do(tiny_model_dir, tmp_path, capsys):
    train, dev = write(tmp_path / "t.csv", _rows(24, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    out = tmp_path / "run"
    assert main(_argv(tiny_model_dir, train, dev, out, "--resume")) == 2
    assert "holds none: drop --resume" in capsys.readouterr().err
    assert not out.exists()  # the refusal wrote nothing
    assert main(_argv(tiny_model_dir, train, dev, out, "--max-steps", "4")) == 0
    capsys.readouterr()
    assert main(_argv(tiny_model_dir, train, dev, out, "--max-steps", "4")) == 2
    assert "--overwrite" in capsys.readouterr().err  # a finished run's folder is not overwritten
    assert main(_argv(tiny_model_dir, train, dev, out, "--max-steps", "6", "--resume")) == 2
    assert "these differ: total_steps" in capsys.readouterr().err


def test_checkpoint_every_is_checked(tiny_model_dir, tmp_path, capsys):
    train, dev = write(tmp_path / "t.csv", _rows(24, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    assert main(_argv(tiny_model_dir, train, dev, tmp_path / "run", "--checkpoint-every", "0")) == 2
    assert "checkpoint_every must be an int >= 1, got 0" in capsys.readouterr().err
