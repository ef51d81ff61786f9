"""A run killed with SIGKILL at any moment resumes to the learners file of an uninterrupted run, tensor for tensor."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_examples, tiny_model
from safetensors import safe_open

import far
from far.training.checkpoint import read_checkpoint

# Dropout on (AdamW trains in train mode), gradient accumulation, warmup, frozen embeddings and
# split heads (so the Primer's snapshot holds projections, heads and embeddings), a checkpoint
# every step, during priming too.
RUNS = {
    "adamw": dict(optimizer="adamw", lr=1e-2, weight_decay=0.1, grad_accum=2),
    "mezo": dict(optimizer="mezo", lr=1e-2, mezo_directions=2),
}
COMMON = dict(
    priming=3,
    max_steps=7,
    batch_size=4,
    warmup=2,
    freeze_embeddings=True,
    attention_retention=0.5,
    checkpoint_every=1,
    keep_checkpoints=2,
    progress=False,
)


def evaluate(model) -> dict[str, float]:
    return {"logit_sum": float(model(**tiny_batch()).logits.double().sum())}


def train(kind: str, output_dir: Path, **kwargs) -> far.FinetuneResult:
    model = tiny_model("bert")
    options = RUNS[kind] | COMMON | kwargs
    result = far.finetune(model, tiny_examples(20), eval_fn=evaluate, output_dir=output_dir, **options)
    far.save_learners(model, output_dir / "learners.safetensors")
    return result


# The child: the same run, killed by SIGKILL at one point (see KILLS).
_CHILD = """
import os, signal, sys
from pathlib import Path
import torch
import far.training.checkpoint as checkpoint
import far.training.loop as loop
import test_resume

kind, where, at, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
calls = [0]

def counting(original):
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if where != "after_checkpoint" and calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if where == "after_checkpoint" and calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapper

if where == "mid_checkpoint":
    checkpoint.torch.save = counting(torch.save)  # dies inside a checkpoint's folder
elif where == "after_checkpoint":
    loop.save_checkpoint = counting(loop.save_checkpoint)
else:  # one forward pass: mid-step, or during priming
    loop.Loop._loss = counting(loop.Loop._loss)
test_resume.train(kind, out)
"""

KILLS = {  # (optimizer, where, at which call, the step it resumes from); a run's first loss is its rehearsal's
    "after-the-switch-checkpoint": ("adamw", "after_checkpoint", 3, 3),
    "mid-step": ("adamw", "loss", 10, 4),  # the first of step 5's two batches
    "during-priming": ("adamw", "loss", 6, 2),  # step 3, the last priming step
    "mid-checkpoint-write": ("mezo", "mid_checkpoint", 10, 4),  # inside step 5's checkpoint (2 torch.save each)
}


def learners_file(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    return {kind: (train(kind, root / kind), root / kind / "learners.safetensors") for kind in RUNS}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(KILLS))
def test_a_run_killed_anywhere_resumes_to_the_same_learners_file(case, tmp_path, uninterrupted):
    kind, where, at, resumes_at = KILLS[case]
    out = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, where, str(at), str(out)],
        cwd=Path(__file__).parent,
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert read_checkpoint(out).step == resumes_at
    result = train(kind, out, resume_from=out)
    whole, whole_path = uninterrupted[kind]
    assert result.metrics == whole.metrics and result.steps == whole.steps
    (meta, tensors), (whole_meta, whole_tensors) = (
        learners_file(out / "learners.safetensors"),
        learners_file(whole_path),
    )
    assert meta["base_fingerprint"] == whole_meta["base_fingerprint"]
    assert tensors.keys() == whole_tensors.keys()
    for key, value in whole_tensors.items():
        assert torch.equal(tensors[key], value), key
    stock = far.load_learners(tiny_model("bert"), out / "learners.safetensors")  # portable, too
    assert far.is_reconfigured(stock)


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    train("mezo", tmp_path, max_steps=5)
    latest = tmp_path / "checkpoints" / "step-5" / "model.safetensors"
    raw = bytearray(latest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    latest.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="far.training.checkpoint"):
        assert read_checkpoint(tmp_path).step == 4
    assert "skipping damaged checkpoints (step-5: corrupted (model.safetensors" in caplog.text
    with pytest.raises(ValueError, match="is corrupted"):
        read_checkpoint(tmp_path / "checkpoints" / "step-5")


def test_resume_refuses_changed_options_and_a_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint at"):
        train("mezo", tmp_path / "none", resume_from=tmp_path / "none")
    train("mezo", tmp_path / "a", max_steps=4)
    with pytest.raises(ValueError, match=r"these differ: .*reset_frozen: saved True, now False"):
        train("mezo", tmp_path / "a", max_steps=4, resume_from=tmp_path / "a", reset_frozen=False)


def test_a_run_reading_its_base_from_the_file_resumes_inside_priming(tiny_model_dir, tmp_path):
    """With `base_weights` the Primer keeps no copy and checks the file against the model: a run resumed during
    priming makes it before the checkpoint's primed weights are loaded, and ends as the uninterrupted run does."""
    from transformers import BertForSequenceClassification

    from far.saving.stock import stock_reader

    options = dict(priming=3, max_steps=5, batch_size=4, lr=1e-2, checkpoint_every=1, keep_checkpoints=None)

    def run(out, **extra):
        torch.manual_seed(0)  # the new 3-label head, the same in every run
        model = BertForSequenceClassification.from_pretrained(
            tiny_model_dir, num_labels=3, ignore_mismatched_sizes=True
        )
        reader = stock_reader(tiny_model_dir, model)
        far.finetune(model, tiny_examples(20), far.FARConfig(0.5), base_weights=reader, output_dir=out,
                     progress=False, **options, **extra)  # fmt: skip
        return model.state_dict()

    whole = run(tmp_path / "whole")
    cut = tmp_path / "cut"
    run(cut)
    for later in ("step-3", "step-4", "step-5"):  # as if killed after step 2's checkpoint, inside priming
        shutil.rmtree(cut / "checkpoints" / later)
    (cut / "checkpoints" / "latest").write_text("step-2")
    resumed = run(cut, resume_from=cut)
    assert whole.keys() == resumed.keys()
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key
