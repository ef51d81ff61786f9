"""A full disk in the middle of a write: a message naming the disk and the bytes, the previous version intact, no
partial file under a final name. Against a real size-limited tmpfs, mounted for the test (root); skipped elsewhere."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_model, write_rows

import far
from far.cli.main import main
from far.storage.atomic import DiskFull, write_json
from far.storage.step_folders import CHECKPOINTS, LATEST, manifest_problem, write_step_folder

LABELS = torch.tensor([0, 1, 2])


@pytest.fixture
def small_disk(tmp_path):
    """`make(size)`: a tmpfs of that size (e.g. "512k"), unmounted after the test."""
    mounts = []

    def make(size: str) -> Path:
        mount = tmp_path / f"disk-{len(mounts)}"
        mount.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a size-limited tmpfs here (root and mount needed): {done.stderr.decode()[:80]}")
        mounts.append(mount)
        return mount

    yield make
    for mount in mounts:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Take all but about `leave` bytes of `disk` with a ballast file."""
    import shutil

    free = shutil.disk_usage(disk).free
    (disk / "ballast").write_bytes(b"\0" * max(0, free - leave))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def trained(steps: int):
    model = tiny_model("bert")
    far.reconfigure(model, 0.4, selection="random", seed=3)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(steps):
        model(**tiny_batch(seed=step), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def assert_names_the_disk(error: DiskFull, disk: Path, target: str) -> None:
    message = str(error)
    assert f"(the filesystem at {disk})" in message and f"writing {target} needed more than" in message
    assert "bytes free there" in message and "Nothing under" in message and "free some space there" in message


def test_a_learners_file_replaced_on_a_full_disk_stays_the_previous_one(small_disk):
    disk = small_disk("2m")
    path = far.save_learners(trained(1), disk / "alice.safetensors")
    before = files(disk)
    fill(disk, 4096)
    before = {**before, "ballast": (disk / "ballast").read_bytes()}
    with pytest.raises(DiskFull) as caught:
        far.save_learners(trained(2), path)
    assert_names_the_disk(caught.value, disk, "alice.safetensors")
    assert files(disk) == before  # the previous file byte for byte, and no partial file beside it


def test_metrics_json_on_a_full_disk(small_disk):
    disk = small_disk("256k")
    write_json(disk / "metrics.json", {"accuracy": 0.5})
    fill(disk, 2048)
    with pytest.raises(DiskFull) as caught:
        write_json(disk / "metrics.json", {"rows": ["x" * 100] * 2000})
    assert_names_the_disk(caught.value, disk, "metrics.json")
    assert json.loads((disk / "metrics.json").read_text()) == {"accuracy": 0.5}
    assert sorted(p.name for p in disk.iterdir()) == ["ballast", "metrics.json"]


def test_a_checkpoint_on_a_full_disk_leaves_the_previous_one_latest(small_disk):
    disk = small_disk("1m")

    def write(size: int):
        return lambda folder: (folder / "state.bin").write_bytes(b"\1" * size)

    first = write_step_folder(disk, 1, write(10_000), keep=2)
    fill(disk, 50_000)
    with pytest.raises(DiskFull) as caught:
        write_step_folder(disk, 2, write(200_000), keep=2)
    assert_names_the_disk(caught.value, disk, "step-2")
    root = disk / CHECKPOINTS
    assert (root / LATEST).read_text() == first.name
    assert manifest_problem(first, required=True) is None
    assert sorted(p.name for p in root.iterdir()) == [LATEST, first.name]  # no step-2, no temporary folder


def test_far_train_into_a_full_disk_says_so_and_exits_2(small_disk, tiny_model_dir, tmp_path, capsys):
    disk = small_disk("1m")  # the tiny model's files alone take about 4 MB
    rows = [{"text": "good fun", "label": "pos"}, {"text": "dull and bad", "label": "neg"}] * 8
    train = write_rows(tmp_path / "t.csv", rows)
    argv = ["train", "--train-file", str(train), "--validation-file", str(train), "--model", str(tiny_model_dir)]
    code = main([*argv, "--output-dir", str(disk / "run"), "--max-steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"(the filesystem at {disk}) is full" in err and "needed more than" in err and "Traceback" not in err
    written = files(disk / "run") if (disk / "run").exists() else {}
    assert "metrics.json" not in written and not any(name.startswith("model/") for name in written)
    assert not any(".tmp-" in name for name in written)


def test_far_export_merge_into_a_full_disk(small_disk, tiny_model_dir, capsys):
    disk = small_disk("512k")
    out = disk / "merged"
    assert main(["export", "--checkpoint", str(tiny_model_dir), "--merge", str(out)]) == 2
    assert f"(the filesystem at {disk}) is full" in capsys.readouterr().err
    assert not out.exists() and [p.name for p in disk.iterdir() if not p.name.startswith(".merged.lock")] == []
