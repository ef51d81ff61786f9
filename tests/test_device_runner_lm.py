"""The device runner (runtime/executorch/far_train) on a causal LM's export: your own texts, trained without Python.

A tiny Llama GGUF is exported with `far export --model FILE --executorch OUT --train-file notes/`, which also
writes the notes as packed chunks (OUT/text.safetensors). The runner trains on them (the bottom's output cached
on disk, AdamW in two micro-batches a step) and must give the losses and held-out score of far.device's Python
trainer (ExecuTorch's bindings, on far's engine) within 1e-4; a run killed with SIGKILL resumes to the
uninterrupted run's state, bit for bit; and the final state, as a learners file for the stock GGUF, scores the
held-out chunks on far's lean runtime at the perplexity the runner printed, within 1%.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_device_runner import kill_at_step, losses, runner  # noqa: F401  (runner: the session's far_train build)
from test_lm_train import write_tiny_gguf

from far.cli.main import main
from far.device.lm_learners import lm_to_learners
from far.device.lm_text import read_chunks
from far.device.manifest import NEXT_TOKEN, read_manifest
from far.device.state import read_state
from far.device.train import train as python_train
from far.evaluation.perplexity import perplexity
from far.llm.gguf import CACHE_ENV
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import load_learners, values_dtype

pytestmark = [pytest.mark.slow, pytest.mark.device]

STEPS = 6


@dataclass
class TextExport:
    gguf: Path
    out: Path
    chunks: Path
    manifest: dict


def export_texts(folder: Path, model_type: str):
    """A tiny GGUF model of `model_type` exported with notes by `far export --model FILE --train-file notes/`."""
    notes = folder / "notes"
    notes.mkdir()
    for i in range(12):
        (notes / f"{i:02d}.txt").write_text(f"note {i}: the cat sat on the mat. " * 5)
    with pytest.MonkeyPatch.context() as patch:
        gguf = write_tiny_gguf(folder, patch, model_type)
        out = folder / "out"
        flags = ["--batch-size", "2", "--micro-batch-size", "1", "--max-length", "16", "--lr", "0.01"]
        assert main(["export", "--model", str(gguf), "--executorch", str(out), "--train-file", str(notes), *flags]) == 0
        yield TextExport(gguf, out, out / "text.safetensors", read_manifest(out, objective=NEXT_TOKEN))


@pytest.fixture(scope="module")
def text_export(tmp_path_factory, runner) -> TextExport:  # noqa: F811
    yield from export_texts(tmp_path_factory.mktemp("text_export"), "llama")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def any_export(request, tmp_path_factory, runner) -> TextExport:  # noqa: F811
    """Each architecture's export (the Llama one is `text_export`'s)."""
    if request.param == "llama":
        yield request.getfixturevalue("text_export")
    else:
        yield from export_texts(tmp_path_factory.mktemp(f"text_export_{request.param}"), request.param)


def run(runner: Path, export: TextExport, state: Path, *extra: str) -> subprocess.CompletedProcess:  # noqa: F811
    cmd = [str(runner), str(export.out), "--examples", str(export.chunks), "--state", str(state), "--threads", "1"]
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def held_out(stdout: str, when: str) -> float:
    """The held-out loss far_train printed `when` ("before" or "after") training."""
    found = re.search(rf"^held_out {when} step=\d+ chunks=\d+ loss=(\S+) perplexity=(\S+)$", stdout, re.M)
    assert found, stdout
    assert abs(math.exp(float(found[1])) - float(found[2])) < 1e-4 * float(found[2])
    return float(found[1])


def start(export: TextExport, path: Path) -> Path:
    shutil.copy(export.out / "state.safetensors", path)
    return path


def test_the_export_writes_the_notes_as_chunks(text_export):
    train, held, _ = read_chunks(text_export.chunks, text_export.manifest)
    assert train.shape[1] == held.shape[1] == 16 and len(train) >= 2 * STEPS and len(held) >= 1
    assert text_export.manifest["text"]["train_chunks"] == len(train)
    assert text_export.manifest["accumulate"] == 2


def test_runner_matches_the_python_trainer(runner, any_export, tmp_path):  # noqa: F811
    text_export = any_export
    assert text_export.manifest["model_type"] == text_export.gguf.stem.removeprefix("tiny-").replace("tiny", "llama")
    state = start(text_export, tmp_path / "runner.safetensors")
    done = run(runner, text_export, state, "--epochs", "1", "--max-steps", str(STEPS))
    assert "bottom cache: wrote" in done.stdout, done.stdout
    result = python_train(
        text_export.out,
        text_export.chunks,
        epochs=1,
        max_steps=STEPS,
        state_path=tmp_path / "python.safetensors",
        eval_examples=text_export.chunks,
    )
    device = losses(done.stdout)
    assert len(device) == len(result.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(device, result.losses, strict=True)) < 1e-4, (device, result.losses)
    assert abs(held_out(done.stdout, "after") - result.evaluations[-1]["loss"]) < 1e-4
    assert held_out(done.stdout, "after") < held_out(done.stdout, "before")
    ours, theirs = (read_state(p, text_export.manifest).tensors for p in (state, result.state_path))
    for name, value in ours.items():
        assert torch.allclose(value, theirs[name], atol=1e-4), name
    again = run(runner, text_export, state, "--epochs", "1", "--max-steps", str(STEPS + 1))
    assert "bottom cache: reused" in again.stdout  # the same chunks and bottom: not computed again


def test_runner_resumes_after_sigkill(runner, text_export, tmp_path):  # noqa: F811
    flags = ["--epochs", "1", "--max-steps", "8", "--checkpoint-every", "3"]
    whole_run = start(text_export, tmp_path / "uninterrupted.safetensors")
    run(runner, text_export, whole_run, *flags)
    killed = start(text_export, tmp_path / "killed.safetensors")
    cmd = [str(runner), str(text_export.out), "--examples", str(text_export.chunks), "--state", str(killed), *flags]
    kill_at_step([*cmd, "--threads", "1"], 5)  # between the checkpoints at 3 and 6
    assert 0 < read_state(killed, text_export.manifest).step < 8
    run(runner, text_export, killed, *flags)  # the same command again
    assert killed.read_bytes() == whole_run.read_bytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_runners_state_as_a_learners_file_scores_what_the_runner_printed(
    runner,  # noqa: F811
    text_export,
    tmp_path,
    monkeypatch,
    dtype,
):
    state = start(text_export, tmp_path / "state.safetensors")
    done = run(runner, text_export, state, "--epochs", "1", "--max-steps", str(STEPS))
    learners = tmp_path / "l.safetensors"
    argv = [
        "export",
        "--from-executorch",
        str(text_export.out),
        "--state",
        str(state),
        "--model",
        str(text_export.gguf),
    ]
    assert main([*argv, "--learners-only", str(learners), "--values-dtype", dtype]) == 0
    model = load_learners(load_lean_model(text_export.gguf, values_dtype(learners)), learners)
    _, held, _ = read_chunks(text_export.chunks, text_export.manifest)
    lean = perplexity(model, held, batch_size=4)["perplexity"]
    printed = math.exp(held_out(done.stdout, "after"))
    assert abs(lean - printed) < 0.01 * printed, (lean, printed)
    if dtype == "float32":  # the state's values exactly: the file of the Python call
        by_python = lm_to_learners(
            text_export.out, state, load_lean_model(text_export.gguf), tmp_path / "p.safetensors"
        )
        assert learners.read_bytes() == by_python.read_bytes()
    stock = perplexity(load_lean_model(text_export.gguf, torch.float32), held, batch_size=4)["perplexity"]
    assert abs(stock - math.exp(held_out(done.stdout, "before"))) < 0.01 * stock
    monkeypatch.setenv(CACHE_ENV, str(text_export.gguf.parent / "cache"))  # its tokenizer (another export's may be set)
    args = ["generate", "--model", str(text_export.gguf), "--learners", str(learners), "--prompt", "the cat"]
    assert main([*args, "--max-new-tokens", "4"]) == 0
