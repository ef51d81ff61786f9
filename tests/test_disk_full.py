"""A full disk in the middle of a write: a message naming the disk and the bytes, the previous version intact, no
partial file under a final name. Against a real size-limited tmpfs, mounted for the test (root); skipped elsewhere."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_model, write_rows
from test_llm_lean import right_padded
from test_llm_lean_saving import loss_fn as lean_loss
from test_lm_train import write_tiny_gguf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, BertForSequenceClassification

import far
import far.device as device
from far.cli.main import main
from far.device.manifest import read_manifest
from far.device.state import read_state
from far.llm import bottom_on_disk
from far.llm.gguf import gguf_cache_path
from far.llm.gguf_file import load_lean_model
from far.llm.lean_checkpoint import FORMAT, read_lean_checkpoint, save_lean_checkpoint
from far.llm.lean_far import prime_and_split
from far.llm.lean_saving import save_trained
from far.llm.state_file import StateFile
from far.llm.tokenizer import TOKENIZER_FILE
from far.llm.zo import CompactMeZO
from far.recipes import causal_lm
from far.recipes.compare import save_trained_tensors
from far.recipes.predict import write_predictions
from far.storage.atomic import DiskFull, write_json
from far.storage.step_folders import CHECKPOINTS, LATEST, manifest_problem, write_step_folder
from far.training.log import RunLog

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
    return write_tiny_gguf(tmp_path, monkeypatch)


@pytest.fixture
def word_gguf(tiny_gguf) -> Path:
    """The tiny GGUF file with a tokenizer that has SST-2's label words as one token each, and little else."""
    vocabulary = {"[UNK]": 0, "</s>": 1, "\u0120great": 2, "\u0120terrible": 3, "\u0120the": 4}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.save(str(Path(f"{gguf_cache_path(tiny_gguf)}-tokenizer") / TOKENIZER_FILE))
    return tiny_gguf


def fill(disk: Path, leave: int) -> None:
    """Take all but about `leave` bytes of `disk` with a ballast file."""
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


def lean_trained(gguf: Path, steps: int):
    """A lean causal LM of `gguf` with FAR's learners, `steps` MeZO steps on one batch."""
    ids, mask = right_padded()
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}
    model = load_lean_model(gguf)
    prime_and_split(model, [batch], lean_loss, far.FARConfig(0.25, seed=0), torch.float32)
    optimizer = CompactMeZO(model, 1e-2, 1e-3, seed=0)
    for _ in range(steps):
        optimizer.step(lambda: lean_loss(model, batch))
    return model


def test_a_gguf_models_learners_file_on_a_full_disk_stays_the_previous_one(small_disk, tiny_gguf):
    disk = small_disk("1m")
    path = disk / "user.safetensors"
    save_trained(lean_trained(tiny_gguf, 1), path, base=tiny_gguf)
    fill(disk, 4096)
    before = files(disk)
    with pytest.raises(DiskFull) as caught:
        save_trained(lean_trained(tiny_gguf, 2), path, base=tiny_gguf)
    assert_names_the_disk(caught.value, disk, "user.safetensors")
    assert files(disk) == before


def test_a_lean_checkpoint_on_a_full_disk_leaves_the_previous_one_latest(small_disk, tiny_gguf):
    disk = small_disk("2m")
    model = lean_trained(tiny_gguf, 1)
    first = save_lean_checkpoint(disk, 1, model, None, {"seconds": 1.0})
    fill(disk, 8192)
    before = files(disk)
    with pytest.raises(DiskFull) as caught:
        save_lean_checkpoint(disk, 2, model, None, {"seconds": 2.0})
    assert_names_the_disk(caught.value, disk, "step-2")
    assert files(disk) == before and read_lean_checkpoint(disk) == (
        first,
        {"seconds": 1.0, "step": 1, "format": FORMAT},
    )


def assert_command_names_the_disk(code: int, err: str, disk: Path) -> None:
    assert code == 2, err
    assert f"(the filesystem at {disk}) is full" in err and "needed more than" in err and "Traceback" not in err


def no_partial_files(folder: Path) -> bool:
    return not any(".tmp-" in p.name for p in folder.rglob("*"))


@pytest.fixture
def user(tiny_model_dir, tmp_path) -> Path:
    """A learners file for the tiny BERT (with its two labels)."""
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    far.reconfigure(model, 0.4, selection="random", seed=3)
    return far.save_learners(model, tmp_path / "users" / "alice.safetensors")


def test_far_predict_output_on_a_full_disk_keeps_the_previous_file(small_disk, tiny_model_dir, user, tmp_path, capsys):
    disk = small_disk("256k")
    many = write_rows(tmp_path / "many.csv", [{"text": f"review {i}: good fun"} for i in range(1000)])
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(user)]
    write_predictions([{"text": "good fun", "label": "pos", "score": 0.9}], disk / "p.csv")  # a previous run's
    fill(disk, 8192)
    before = files(disk)
    code = main([*argv, "--input", str(many), "--output", str(disk / "p.csv")])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    assert files(disk) == before


def test_far_predict_output_dir_on_a_full_disk_exits_2(small_disk, tiny_model_dir, user, tmp_path, capsys):
    disk = small_disk("256k")
    many = write_rows(tmp_path / "many.csv", [{"text": f"review {i}: good fun"} for i in range(1000)])
    fill(disk, 8192)
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(user.parent), "--input", str(many)]
    code = main([*argv, "--output-dir", str(disk / "out")])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    assert not (disk / "out" / "alice.jsonl").exists() and no_partial_files(disk)


def test_far_export_learners_only_on_a_full_disk_keeps_the_previous_file(small_disk, tmp_path, capsys):
    disk = small_disk("1m")
    checkpoint = far.save_pretrained(trained(2), tmp_path / "ckpt")
    far.save_learners(trained(1), disk / "user.safetensors")
    fill(disk, 4096)
    before = files(disk)
    code = main(["export", "--checkpoint", str(checkpoint), "--learners-only", str(disk / "user.safetensors")])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    assert {k: v for k, v in files(disk).items() if ".lock" not in k} == before


def test_far_export_peft_on_a_full_disk_writes_nothing(small_disk, tiny_model_dir, user, capsys):
    pytest.importorskip("peft")
    disk = small_disk("256k")
    fill(disk, 8192)
    out = disk / "alice-lora"
    code = main(["export", "--checkpoint", str(tiny_model_dir), "--learners", str(user), "--peft", str(out)])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    assert not out.exists() and no_partial_files(disk)


def test_far_train_whose_disk_fills_at_the_end_writes_no_metrics_or_predictions(
    small_disk, tiny_model_dir, tmp_path, capsys
):
    disk = small_disk("256k")
    rows = [{"text": "good fun", "label": "pos"}, {"text": "dull and bad", "label": "neg"}] * 8
    train = write_rows(tmp_path / "t.csv", rows)
    validation = write_rows(tmp_path / "v.csv", rows * 200)  # 40 kB of predictions
    fill(disk, 24_576)  # room for the run's small files, not for its predictions
    argv = ["train", "--train-file", str(train), "--validation-file", str(validation), "--model", str(tiny_model_dir)]
    code = main([*argv, "--output-dir", str(disk / "run"), "--max-steps", "2", "--no-progress", "--no-save-model"])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    left = sorted(p.name for p in (disk / "run").iterdir())
    assert "metrics.json" not in left and "predictions.tsv" not in left and no_partial_files(disk), left


def test_far_glue_with_a_causal_lm_whose_disk_fills_at_the_end(small_disk, word_gguf, data_dir, monkeypatch, capsys):
    disk = small_disk("256k")
    write = causal_lm._write_predictions

    def then_fill(*args) -> None:  # the disk fills as the run writes its files
        write(*args)
        fill(disk, 0)

    monkeypatch.setattr(causal_lm, "_write_predictions", then_fill)
    argv = ["glue", "--task", "sst2", "--model", str(word_gguf), "--optimizer", "mezo", "--max-steps", "2"]
    argv += ["--batch-size", "4", "--priming", "1", "--max-train-samples", "16", "--max-eval-samples", "8"]
    code = main([*argv, "--data-dir", str(data_dir), "--output-dir", str(disk / "run"), "--no-progress"])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    left = sorted(p.name for p in (disk / "run").iterdir())
    assert "log.jsonl" not in left and "metrics.json" not in left and no_partial_files(disk), left


@pytest.fixture(scope="module")
def device_export(tmp_path_factory, minilm_path) -> Path:
    """A FAR checkpoint of a tiny BERT with MiniLM's tokenizer, and its ExecuTorch export (with 8 examples)."""
    pytest.importorskip("executorch")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    model = tiny_model("bert", num_labels=2, vocab_size=tokenizer.vocab_size, max_position_embeddings=32)
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    far.reconfigure(model, far.FARConfig(retention=0.25, selection="random", freeze_embeddings=True))
    folder = tmp_path_factory.mktemp("device")
    far.save_pretrained(model, folder / "ckpt")
    tokenizer.save_pretrained(folder / "ckpt")
    out = folder / "out"
    device.export_executorch(
        model, tokenizer, out, batch_size=2, max_length=8, lr=0.05, xnnpack=False, bottom_xnnpack=False
    )
    texts = ["good fun", "dull", "lovely", "awful", "great", "bad", "fine", "boring"]
    device.write_examples(texts, tokenizer, out, out / "examples.safetensors", labels=["pos", "neg"] * 4)
    return out


@pytest.mark.slow
@pytest.mark.device
def test_device_training_on_a_full_disk_keeps_the_previous_state(small_disk, device_export):
    disk = small_disk("1m")
    state = disk / "state.safetensors"
    device.train(device_export, device_export / "examples.safetensors", state_path=state, max_steps=1)
    fill(disk, 4096)
    before = files(disk)
    with pytest.raises(DiskFull) as caught:
        device.train(device_export, device_export / "examples.safetensors", state_path=state, resume=True, epochs=2)
    assert_names_the_disk(caught.value, disk, "state.safetensors")
    assert files(disk) == before and read_state(state, read_manifest(device_export)).step == 1


@pytest.mark.slow
@pytest.mark.device
def test_far_export_executorch_into_a_full_disk_writes_nothing(small_disk, device_export, capsys):
    disk = small_disk("1m")  # the programs take about 4 MB
    out = disk / "device"
    argv = ["export", "--checkpoint", str(device_export.parent / "ckpt"), "--executorch", str(out)]
    code = main([*argv, "--batch-size", "2", "--max-length", "8", "--xnnpack", "none"])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    assert not out.exists() and no_partial_files(disk)


def test_the_demos_trained_tensors_on_a_full_disk_keep_the_previous_file(small_disk):
    disk = small_disk("1m")
    path = save_trained_tensors(trained(1), disk / "bottom1" / "trained.safetensors")
    fill(disk, 4096)
    before = files(disk)
    with pytest.raises(DiskFull) as caught:  # safetensors' own error (no OSError): a traceback from far demo
        save_trained_tensors(trained(2), path)
    assert_names_the_disk(caught.value, disk, "trained.safetensors")
    assert files(disk) == before


def test_far_train_whose_disk_fills_while_it_trains_says_so_and_exits_2(
    small_disk, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    disk = small_disk("256k")
    write = RunLog.write

    def then_fill(self, record: dict) -> None:  # the disk fills after the first step's line (more fill its last page)
        write(self, record)
        fill(disk, 0)
        logging.getLogger("far.training").info("a record longer than a page: %s", "x" * 8192)  # train.log's

    monkeypatch.setattr(RunLog, "write", then_fill)
    rows = [{"text": "good fun", "label": "pos"}, {"text": "dull and bad", "label": "neg"}] * 8
    train = write_rows(tmp_path / "t.csv", rows)
    argv = ["train", "--train-file", str(train), "--validation-file", str(train), "--model", str(tiny_model_dir)]
    code = main([*argv, "--output-dir", str(disk / "run"), "--max-steps", "60", "--batch-size", "8", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"(the filesystem at {disk}) is full" in err and "Traceback" not in err and "Logging error" not in err
    assert not (disk / "run" / "metrics.json").exists() and no_partial_files(disk)


def test_far_glue_whose_disk_fills_at_the_end_writes_no_metrics_or_predictions(
    small_disk, tiny_model_dir, data_dir, monkeypatch, capsys
):
    disk = small_disk("256k")
    close = RunLog.close

    def then_fill(self) -> None:  # the disk fills as training ends, before the predictions and metrics.json
        close(self)
        fill(disk, 0)

    monkeypatch.setattr(RunLog, "close", then_fill)
    argv = ["glue", "--task", "sst2", "--model", str(tiny_model_dir), "--max-steps", "2", "--max-train-samples", "16"]
    argv += ["--max-eval-samples", "64", "--data-dir", str(data_dir), "--no-save-model", "--no-progress"]
    code = main([*argv, "--output-dir", str(disk / "run")])
    assert_command_names_the_disk(code, capsys.readouterr().err, disk)
    left = sorted(p.name for p in (disk / "run").rglob("*"))
    assert "metrics.json" not in left and not any(name.startswith("predictions") for name in left), left
    assert no_partial_files(disk)
