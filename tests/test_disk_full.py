"""A full disk in the middle of a write: a message naming the disk and the bytes, the previous version intact, no
partial file under a final name. Against a real size-limited tmpfs, mounted for the test (root); skipped elsewhere."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_model, write_rows
from test_llm_lean import tiny_hf, write_gguf
from test_lm_texts import char_tokenizer

import far
from far.cli.main import main
from far.llm import bottom_on_disk
from far.llm.gguf import CACHE_ENV, gguf_cache_path
from far.llm.state_file import StateFile
from far.llm.tokenizer import SPECIAL_FILE, TOKENIZER_FILE
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


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch) -> Path:
    """A tiny Llama GGUF file whose tokenizer (a token per character) waits in far's cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_hf("llama"), path)
    folder = Path(f"{gguf_cache_path(path)}-tokenizer")
    folder.mkdir(parents=True)
    char_tokenizer().tokenizer.save(str(folder / TOKENIZER_FILE))
    (folder / SPECIAL_FILE).write_text(json.dumps({"pad_token_id": 1, "eos_token_id": 1}))
    return path


@pytest.fixture
def notes(tmp_path) -> Path:
    """A tiny, repetitive corpus."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02d}.txt").write_text("the cat sat on the mat. " * 6)
    return folder


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


def test_the_frozen_bottoms_scratch_file_on_a_full_disk_names_the_disk_and_the_bytes(small_disk):
    disk = small_disk("256k")
    states = StateFile(disk)
    first = torch.arange(1000, dtype=torch.float32)
    states.put(b"first", first)
    fill(disk, 16_384)
    with pytest.raises(DiskFull) as caught:
        states.put(b"second", torch.ones(64_000))  # 256,000 bytes
    message = str(caught.value)
    assert f"(the filesystem at {disk}) is full" in message and "needed 256,000 bytes" in message
    assert "free some space there" in message
    assert b"second" not in states and torch.equal(states.get(b"first"), first)  # what was kept still reads back
    (disk / "ballast").unlink()
    states.put(b"second", torch.ones(64_000))  # the failed write gave its disk back: room again once freed
    assert torch.equal(states.get(b"second"), torch.ones(64_000)) and torch.equal(states.get(b"first"), first)
    states.close()
    assert sorted(p.name for p in disk.iterdir()) == []  # nameless: nothing left in the folder


def test_far_train_whose_scratch_file_fills_the_disk_stops_with_exit_2(
    small_disk, tiny_gguf, notes, monkeypatch, capsys
):
    disk = small_disk("1m")
    # The room check passes on any disk: the disk fills while the bottom's states are written, as another
    # process filling it would make it.
    monkeypatch.setattr(bottom_on_disk, "SPARE_DISK_BYTES", -(2**40))
    fill(disk, 8192)
    argv = ["train", "--model", str(tiny_gguf), "--train-file", str(notes), "--max-steps", "2", "--max-length", "32"]
    code = main([*argv, "--batch-size", "4", "--output-dir", str(disk / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"(the filesystem at {disk}) is full: the frozen bottom's scratch file needed" in err
    assert "Traceback" not in err
    assert not (disk / "run" / "metrics.json").exists() and not (disk / "run" / "learners.safetensors").exists()
