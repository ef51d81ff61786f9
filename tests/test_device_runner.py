"""The device runner (runtime/executorch/far_train) against torch and against far.device's Python trainer.

A tiny FAR-reconfigured BERT is exported with `far.device.export_executorch`, with and without a frozen
bottom program. The runner trains it from a perturbed state (so a state that failed to load would show),
and the same steps in torch eager on the reconfigured model itself, in `far.device.order`'s batch order,
must land on the same parameters. A run begun in Python goes on in the runner and the other way round.
Then the refusals, and a run killed with SIGKILL that resumes to the same final state, bit for bit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoTokenizer

import far
from far.device.examples import read_examples, write_examples
from far.device.export import export_executorch
from far.device.manifest import read_manifest
from far.device.order import batch_indices
from far.device.state import DeviceState, read_state, write_state
from far.device.train import train as python_train
from far.training.schedule import WarmupLinear

pytestmark = [pytest.mark.slow, pytest.mark.device]

RUNNER_DIR = Path(__file__).resolve().parents[1] / "runtime" / "executorch"
BATCH, LENGTH, N_EXAMPLES = 4, 12, 22  # 22 // 4 = 5 steps an epoch, 2 examples left over
LR, MOMENTUM, SEED = 0.05, 0.9, 7
WORDS = "good bad movie film great awful plot fun dull nice".split()


def _missing_tool() -> str | None:
    if importlib.util.find_spec("executorch") is None:
        return "executorch is not installed (pip install executorch==1.5.1)"
    if shutil.which("cmake") is None:
        return "cmake is not installed (needed to build runtime/executorch)"
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "no C++ compiler (c++, g++ or clang++) to build runtime/executorch"
    return None


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Path:
    """far_train, built once per session into a temporary folder (or $FAR_TRAIN_BUILD_DIR, built on there)."""
    reason = _missing_tool()
    if reason:
        pytest.skip(reason)
    build = Path(os.environ.get("FAR_TRAIN_BUILD_DIR") or tmp_path_factory.mktemp("far_train_build"))
    done = subprocess.run(
        ["bash", str(RUNNER_DIR / "build.sh"), sys.executable],
        env={**os.environ, "FAR_TRAIN_BUILD_DIR": str(build)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return build / "far_train"


def test_cpp_tests_pass(runner):
    """CTest's tests of the runner's parts (batch order, state reader, optimizer, file formats), in the same build."""
    done = subprocess.run(
        ["ctest", "--test-dir", str(runner.parent), "--output-on-failure"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100% tests passed" in done.stdout, done.stdout


@dataclass
class Exported:
    out: Path  # the export folder
    manifest: dict
    model: nn.Module  # the reconfigured model it was exported from
    start: Path  # a state at step 0, away from the exported values
    examples: Path


def _export(folder: Path, frozen_layers: int | None, minilm_path: str, **settings) -> Exported:
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    model = tiny_model("bert", num_labels=3, vocab_size=tokenizer.vocab_size)
    config = far.FARConfig(retention=0.5, selection="random", freeze_embeddings=True, freeze_layers=frozen_layers)
    far.reconfigure(model, config)
    out = folder / "out"
    settings = settings or dict(lr=LR, momentum=MOMENTUM)
    export_executorch(model, tokenizer, out, batch_size=BATCH, max_length=LENGTH, **settings)
    manifest = read_manifest(out)
    assert manifest["bottom"] == (frozen_layers is not None)

    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 6)) for i in range(N_EXAMPLES)]
    labels = [i % 3 for i in range(N_EXAMPLES)]
    examples = write_examples(texts, tokenizer, out, folder / "examples.safetensors", labels=labels)
    # The run starts away from the values baked into train.pte, so the runner must really load the state.
    g = torch.Generator().manual_seed(3)
    initial = read_state(out / "state.safetensors", manifest).tensors
    moved = {n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in initial.items()}
    start = write_state(folder / "start.safetensors", DeviceState(tensors=moved, order_seed=SEED), manifest)
    return Exported(out, manifest, model.eval(), start, examples)


@pytest.fixture(scope="module", params=[None, 1], ids=["whole", "frozen-bottom"])
def exported(request, tmp_path_factory, runner, minilm_path) -> Exported:
    return _export(tmp_path_factory.mktemp("export"), request.param, minilm_path)


def command(runner: Path, exported: Exported, state: Path, *extra: str, examples: Path | None = None) -> list[str]:
    examples = examples or exported.examples
    return [
        str(runner),
        str(exported.out),
        "--examples",
        str(examples),
        "--state",
        str(state),
        "--threads",
        "1",
        *extra,
    ]


def train(runner: Path, exported: Exported, state: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command(runner, exported, state, *extra), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def losses(stdout: str) -> list[float]:
    """The losses far_train printed, one per step (`step=3 epoch=0 loss=1.039350 time_s=0.000 cpu_s=0.000`)."""
    fields = (dict(w.split("=") for w in line.split()) for line in stdout.splitlines() if line.startswith("step="))
    return [float(f["loss"]) for f in fields]


def eager_run(exported: Exported, steps: int, adamw: dict | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """`steps` of torch.optim.SGD on the reconfigured model itself, from the start state, in far.device's order.

    With `adamw` (ADAMW_SETTINGS): torch.optim.AdamW, clip_grad_norm_ and far's WarmupLinear schedule instead.
    """
    params = dict(exported.model.named_parameters())
    start = read_state(exported.start, exported.manifest).tensors
    # The state keeps an output projection's learner columns as (out, k); far.SplitLinear keeps nodes as rows.
    transposed = {n for n, t in start.items() if params[n].shape != t.shape}
    with torch.no_grad():
        for name, value in start.items():
            params[name].copy_(value.t() if name in transposed else value)
    names = [spec["name"] for spec in exported.manifest["trainable"]]
    trained = [params[n] for n in names]
    if adamw is None:
        opt, scheduler = torch.optim.SGD(trained, lr=LR, momentum=MOMENTUM), None
    else:
        opt = torch.optim.AdamW(trained, lr=adamw["lr"], weight_decay=adamw["weight_decay"], foreach=False)
        sched = adamw["schedule"]
        factor = WarmupLinear(sched["total_steps"], sched["warmup_steps"], offset=sched["offset"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    data, _ = read_examples(exported.examples, exported.manifest)
    per_epoch, trace = N_EXAMPLES // BATCH, []
    for step in range(steps):
        rows = torch.from_numpy(batch_indices(SEED, step // per_epoch, step % per_epoch, N_EXAMPLES, BATCH))
        opt.zero_grad()
        # The runner's micro-batches: each backward adds a micro-batch mean's gradient, then their sum / K.
        micro, parts = exported.manifest["micro_batch_size"], exported.manifest["accumulate"]
        loss = 0.0
        for part in range(parts):
            batch = {k: v[rows[part * micro : (part + 1) * micro]] for k, v in data.items()}
            part_loss = exported.model(**batch).loss  # eval mode: no dropout, as exported
            part_loss.backward()
            loss += part_loss / parts
        for p in trained:
            p.grad.div_(parts)
        if adamw is not None:
            torch.nn.utils.clip_grad_norm_(trained, adamw["max_grad_norm"], foreach=False)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        trace.append(float(loss))
    return {n: (params[n].t() if n in transposed else params[n]).detach().clone() for n in names}, trace


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


# AdamW with clipping, weight decay and far's schedule, each step two micro-batches of 2: the update a
# host run makes on the whole batch of 4, continued from the host's step 1 of 12.
ADAMW_SETTINGS = dict(
    optimizer="adamw",
    lr=2e-3,
    weight_decay=0.01,
    max_grad_norm=0.5,
    schedule={"warmup_steps": 2, "total_steps": 12, "offset": 1},
    micro_batch_size=2,
)


# ---- the tests ----


def test_runner_with_adamw_and_micro_batches_matches_torch(runner, tmp_path, minilm_path):
    exported = _export(tmp_path, 1, minilm_path, **ADAMW_SETTINGS)
    assert (exported.manifest["micro_batch_size"], exported.manifest["accumulate"]) == (2, 2)
    state = tmp_path / "state.safetensors"
    shutil.copy(exported.start, state)
    done = train(runner, exported, state, "--epochs", "3", "--max-steps", "11")  # the schedule ends at 12 - 1
    expected, expected_losses = eager_run(exported, steps=11, adamw=ADAMW_SETTINGS)
    got = read_state(state, exported.manifest)
    assert got.step == 11 and set(got.slots) == {"exp_avg", "exp_avg_sq"}
    # An attention key bias shifts every score of a query alike, which softmax ignores: its gradient is
    # zero but for rounding, and Adam scales that rounding up to steps of about lr. Those tensors follow
    # each kernel's rounding, not the maths, so they are left out of the comparison with torch.
    meaningful = [n for n in expected if not n.endswith("attention.self.key.bias")]
    assert len(meaningful) < len(expected)
    assert _max_diff({n: got.tensors[n] for n in meaningful}, {n: expected[n] for n in meaningful}) <= 1e-5
    assert max(abs(a - b) for a, b in zip(losses(done.stdout), expected_losses, strict=True)) <= 1e-5

    # The Python trainer takes the same steps: 4 here, 7 more in the runner, and the other way round.
    for first, second in ((python_train, train), (train, python_train)):
        path = tmp_path / f"{first.__module__}.safetensors"
        shutil.copy(exported.start, path)
        for run, steps in ((first, 4), (second, 11)):
            if run is python_train:
                python_train(exported.out, exported.examples, epochs=3, max_steps=steps, state_path=path, resume=True)
            else:
                train(runner, exported, path, "--epochs", "3", "--max-steps", str(steps), "--resume")
        assert _max_diff(read_state(path, exported.manifest).tensors, got.tensors) <= 1e-5  # the same kernels


def test_runner_matches_torch(runner, exported, tmp_path):
    state = tmp_path / "state.safetensors"
    shutil.copy(exported.start, state)
    done = train(runner, exported, state, "--epochs", "2")  # 10 steps, over the epoch boundary

    expected, expected_losses = eager_run(exported, steps=10)
    got = read_state(state, exported.manifest)  # far's own reader accepts the runner's file
    assert _max_diff(got.tensors, expected) <= 1e-5
    assert max(abs(a - b) for a, b in zip(losses(done.stdout), expected_losses, strict=True)) <= 1e-5
    assert set(got.momentum) == set(got.tensors)
    assert (got.step, got.epoch, got.batch, got.order_seed) == (10, 2, 0, SEED)
    assert got.examples_sha256 == hashlib.sha256(exported.examples.read_bytes()).hexdigest()


def test_runner_and_python_trainer_resume_each_other(runner, exported, tmp_path):
    whole_run = tmp_path / "runner.safetensors"
    shutil.copy(exported.start, whole_run)
    train(runner, exported, whole_run, "--epochs", "3")
    expected = read_state(whole_run, exported.manifest).tensors

    python_first = tmp_path / "python-first.safetensors"
    shutil.copy(exported.start, python_first)
    python_train(exported.out, exported.examples, epochs=1, state_path=python_first, resume=True)
    train(runner, exported, python_first, "--epochs", "3")

    runner_first = tmp_path / "runner-first.safetensors"
    shutil.copy(exported.start, runner_first)
    train(runner, exported, runner_first, "--epochs", "1")
    python_train(exported.out, exported.examples, epochs=3, state_path=runner_first, resume=True)

    for path in (python_first, runner_first):
        state = read_state(path, exported.manifest)
        assert state.step == 15
        assert _max_diff(state.tensors, expected) <= 1e-6  # the same kernels; SGD's rounding may differ


@pytest.mark.parametrize(
    "case, message",
    [
        ("other-program", "was written for another training program"),
        ("other-base", "belongs to another base model"),
        ("truncated", "truncated"),
        ("flipped-byte", "is damaged"),
        ("wrong-shape", "the manifest says"),
        ("too-long", "more than the program's max_length"),
        ("bad-label", "not a class id of the program"),
        ("other-task", "was written for another task (4 classes"),
        ("other-classes", "was written for another export: its classes"),
    ],
)
def test_runner_refuses_before_training(runner, exported, tmp_path, case, message):
    state, examples = tmp_path / "state.safetensors", exported.examples
    start = read_state(exported.start, exported.manifest)
    if case == "other-program":
        other = {**exported.manifest, "programs": {"train": {"file": "train.pte", "sha256": "0" * 64}}}
        write_state(state, start, other)
    elif case == "other-base":
        write_state(state, start, {**exported.manifest, "base_fingerprint": "another base"})
    elif case == "wrong-shape":  # well formed, but its first tensor has another shape
        name = next(iter(start.tensors))
        start.tensors[name] = torch.zeros(*start.tensors[name].shape[:-1], start.tensors[name].shape[-1] + 1)
        write_state(state, DeviceState(tensors=start.tensors, order_seed=SEED), exported.manifest)
    else:
        shutil.copy(exported.start, state)
    if case == "truncated":
        state.write_bytes(state.read_bytes()[:-100])
    elif case == "flipped-byte":
        data = bytearray(state.read_bytes())
        data[-5] ^= 0x40
        state.write_bytes(bytes(data))
    elif case in ("too-long", "bad-label"):
        tensors = load_file(exported.examples)
        if case == "too-long":  # two more columns, and example 5 uses them: LENGTH + 2 real tokens
            tensors = {k: torch.cat([v, v[:, :2]], dim=1) if v.dim() == 2 else v for k, v in tensors.items()}
            tensors["attention_mask"][5] = 1
        else:
            tensors["labels"][3] = 3
        examples = tmp_path / "examples.safetensors"
        save_file(tensors, examples)
    elif case in ("other-task", "other-classes"):  # the same base, another task: as far.device.write_examples writes
        with safe_open(exported.examples, framework="pt") as f:
            metadata = f.metadata()
        if case == "other-task":
            metadata["num_labels"] = "4"
        else:
            metadata["labels"] = json.dumps(list(reversed(json.loads(metadata["labels"]))))
        examples = tmp_path / "examples.safetensors"
        save_file(load_file(exported.examples), examples, metadata=metadata)
    before = state.read_bytes()

    cmd = command(runner, exported, state, "--epochs", "1", examples=examples)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "refused" in done.stderr
    assert "step=" not in done.stdout
    assert state.read_bytes() == before


def kill_at_step(cmd: list[str], step: int) -> None:
    """Run far_train's `cmd` and SIGKILL it once it has printed step `step`'s line; check that it died so."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith(f"step={step} "):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_runner_resumes_after_sigkill(runner, exported, tmp_path):
    epochs, every = "40", "3"  # 200 steps
    whole_run = tmp_path / "uninterrupted.safetensors"
    shutil.copy(exported.start, whole_run)
    train(runner, exported, whole_run, "--epochs", epochs, "--checkpoint-every", every)

    killed = tmp_path / "killed.safetensors"
    shutil.copy(exported.start, killed)
    kill_at_step(command(runner, exported, killed, "--epochs", epochs, "--checkpoint-every", every), 8)  # 6 < 8 < 9
    stopped_at = read_state(killed, exported.manifest).step
    assert 0 < stopped_at < 200, "the kill came after the run had finished"

    train(runner, exported, killed, "--epochs", epochs, "--checkpoint-every", every)  # the same command again
    assert killed.read_bytes() == whole_run.read_bytes()


def test_runner_checkpoint_on_a_full_disk(runner, exported, tmp_path):
    """A checkpoint that does not fit its disk: exit 1, a message naming the disk and bytes, the state as it was.

    The state (step 0, no optimizer slots) is put on a tmpfs with room for it and half as much again; the first
    checkpoint carries momentum too, so its .tmp cannot fit beside it.
    """
    disk = tmp_path / "disk"
    disk.mkdir()
    size_kib = (exported.start.stat().st_size * 3 // 2) // 1024 + 8
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        state = disk / "state.safetensors"
        shutil.copy(exported.start, state)
        before = state.read_bytes()
        cmd = command(runner, exported, state, "--epochs", "1", "--checkpoint-every", "2")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"far_train: error: no space left on the disk mounted at {disk} (tmpfs filesystem" in done.stderr
        assert re.search(r"it needs \d+ bytes, \d+ bytes are free there", done.stderr), done.stderr
        assert f"{state} keeps its previous version, unchanged" in done.stderr, done.stderr
        assert "step=2 " in done.stdout and "checkpoint step=" not in done.stdout
        assert state.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["state.safetensors"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)
