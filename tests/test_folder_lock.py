"""One process at a time in an output folder: one winner of a race, no stale lock, nothing changed by the loser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_rows

from far.cli.main import main
from far.storage import lock

ROOT = Path(__file__).resolve().parent.parent
# A child that takes commands on stdin: "hold FOLDER" (answers held / refused ...), "release FOLDER" (answers ok).
CHILD = """
import sys
from far.storage import lock
for line in sys.stdin:
    verb, folder = line.split(maxsplit=1)
    try:
        getattr(lock, verb)(folder.strip())
        print("held" if verb == "hold" else "ok", flush=True)
    except lock.FolderInUse as e:
        print("refused", e, flush=True)
"""


def child() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def ask(processes: list[subprocess.Popen], line: str) -> list[str]:
    for process in processes:  # both written before either answer is read: they race
        process.stdin.write(line + "\n")
        process.stdin.flush()
    return [process.stdout.readline() for process in processes]


def test_two_processes_racing_for_a_folder_have_one_winner_every_time(tmp_path):
    racers = [child(), child()]
    try:
        for round_ in range(20):
            folder = tmp_path / f"run-{round_}"
            answers = ask(racers, f"hold {folder}")
            assert sorted(line.split()[0] for line in answers) == ["held", "refused"], (round_, answers)
            refusal = next(line for line in answers if line.startswith("refused"))
            winner = racers[answers.index(next(line for line in answers if line.startswith("held")))]
            assert f"is in use by pid {winner.pid} " in refusal
            assert "Wait for that run to end, or choose another folder" in refusal
            assert not folder.exists()  # the lock lives beside the folder; neither racer made it
            assert ask(racers, f"release {folder}") == ["ok\n"] * 2
    finally:
        for racer in racers:
            racer.stdin.close()
            racer.wait(timeout=10)


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "run"
    holder = child()
    assert ask([holder], f"hold {folder}") == ["held\n"]
    with pytest.raises(lock.FolderInUse, match=rf"pid {holder.pid} "):
        lock.hold(folder)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    lock.hold(folder)  # the kernel dropped the killed process's lock
    lock.hold(folder)  # and holding twice in one process is one hold
    lock.release(folder)


def test_a_run_into_a_held_folder_is_refused_before_anything_loads(tmp_path, tiny_model_dir, capsys):
    folder = tmp_path / "run"
    holder = child()
    try:
        assert ask([holder], f"hold {folder}") == ["held\n"]
        train = write_rows(tmp_path / "t.csv", [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}] * 4)
        argv = ["train", "--train-file", str(train), "--validation-file", str(train), "--model", str(tiny_model_dir)]
        argv += ["--output-dir", str(folder)]
        assert main([*argv, "--max-steps", "1", "--no-progress"]) == 2
        assert f"is in use by pid {holder.pid}" in capsys.readouterr().err
        assert not folder.exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
