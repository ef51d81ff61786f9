"""The memory budget: the planner's rules, micro-batches that give the batch's update, the CLI's refusal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import far
from far.config import FARConfig
from far.training.budget import MemoryBudgetError, ModelShape, estimate_mib, plan_memory

MINILM = ModelShape.from_config(
    dict(
        hidden_size=384,
        num_hidden_layers=6,
        intermediate_size=1536,
        num_attention_heads=12,
        vocab_size=30522,
        max_position_embeddings=512,
        type_vocab_size=2,
    )
)
ROOT = Path(__file__).resolve().parents[1]


def test_shape_counts_minilm_parameters():
    assert abs(MINILM.params - 22_713_216) < 1000


@pytest.mark.parametrize("far_config", [None, FARConfig(0.2, freeze_embeddings=True)])
def test_more_budget_never_gives_a_smaller_micro_batch(far_config):
    micro = 0
    for budget in range(800, 3000, 25):
        try:
            plan = plan_memory(budget, MINILM, batch_size=32, seq_len=128, far=far_config)
        except MemoryBudgetError:
            assert micro == 0, "a budget refused after a smaller one fitted"
            continue
        assert plan.micro_batch >= micro and 32 % plan.micro_batch == 0
        assert plan.micro_batch * plan.accumulation == 32 and plan.estimate_mib <= budget
        micro = plan.micro_batch
    assert micro == 32


def test_refusal_names_the_smallest_budget_that_fits():
    far_config = FARConfig(0.2, freeze_embeddings=True)
    with pytest.raises(MemoryBudgetError, match=r"the smallest that fits is (\d+) MiB") as info:
        plan_memory(300, MINILM, batch_size=32, seq_len=128, far=far_config)
    minimum = info.value.minimum_mib
    plan = plan_memory(minimum, MINILM, batch_size=32, seq_len=128, far=far_config)
    assert plan.micro_batch == 1
    with pytest.raises(MemoryBudgetError):
        plan_memory(minimum - 1, MINILM, batch_size=32, seq_len=128, far=far_config)


def test_levers_are_turned_on_cheapest_first():
    far_config = FARConfig(0.2, freeze_embeddings=True, recompute_activations=False)  # every lever off to begin with
    roomy = plan_memory(10_000, MINILM, batch_size=32, seq_len=128, far=far_config)
    assert (roomy.micro_batch, roomy.early_frozen_embeddings, roomy.recompute_activations) == (32, False, False)
    tight = plan_memory(900, MINILM, batch_size=32, seq_len=128, far=far_config)
    assert tight.early_frozen_embeddings and tight.micro_batch < 32
    kwargs = dict(seq_len=128, micro_batch=4, eval_batch_size=8, far=far_config)
    assert estimate_mib(MINILM, early_frozen_embeddings=True, **kwargs) < estimate_mib(MINILM, **kwargs)


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="positive number of MiB"):
        plan_memory(-1, MINILM, batch_size=32, seq_len=128, far=None)


def _tiny():
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def _examples(n: int = 16):
    g = torch.Generator().manual_seed(1)
    return [
        {
            "input_ids": torch.randint(1, 50, (8,), generator=g),
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }
        for i in range(n)
    ]


def test_micro_batches_give_the_batch_update(monkeypatch):
    """A batch of 8 as 4 accumulated micro-batches of 2 takes the same optimizer steps (allclose)."""
    data = _examples()
    one, micro = _tiny(), _tiny()
    options = dict(config=None, batch_size=8, max_steps=2, lr=1e-2, progress=False)
    far.finetune(one, data, **options)
    # A budget that plans micro-batches of 2 for this tiny model: the estimate's base is the only large part.
    monkeypatch.setattr("far.training.budget.BASE_MIB", 0.0)
    monkeypatch.setattr("far.training.budget.ACTIVATION_FACTOR", 1e5)
    shape = ModelShape.from_config(micro.config)
    two, four = (estimate_mib(shape, seq_len=8, micro_batch=m, eval_batch_size=1, far=None) for m in (2, 4))
    budget = (two + four) / 2  # fits micro-batches of 2, not of 4
    plan = plan_memory(budget, shape, batch_size=8, seq_len=8, far=None, eval_batch_size=1)
    assert (plan.micro_batch, plan.accumulation) == (2, 4)
    far.finetune(micro, data, memory_budget=budget, max_length=8, **options)
    for (name, a), b in zip(one.named_parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_the_cli_refuses_a_small_budget_fast(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence1,sentence2,label\na b,c d,1.5\ne f,g h,2.5\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "far.cli.main", "train", "--train-file", str(train), "--validation-file"]
    command += [str(train), "--method", "far", "--retention", "0.2", "--freeze-embeddings", "--memory-budget", "300"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert time.perf_counter() - start < 20  # ~6 s alone here; the CPUs are shared
    assert done.returncode == 2
    assert re.search(
        r"far train: error: --memory-budget 300 MiB cannot fit .* smallest that fits is \d+ MiB", done.stderr
    )


@pytest.mark.slow
def test_a_budgeted_run_prints_its_plan_and_peak(tmp_path):
    rows = "".join(f"the cat {i} sat,a dog {i} ran,{i % 5}.5\n" for i in range(64))
    train = tmp_path / "train.csv"
    train.write_text("sentence1,sentence2,label\n" + rows)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "far.cli.main", "train", "--train-file", str(train), "--validation-file"]
    command += [str(train), "--method", "far", "--retention", "0.2", "--freeze-embeddings", "--max-length", "32"]
    command += ["--batch-size", "32", "--max-steps", "2", "--priming", "1", "--memory-budget", "1200"]
    command += ["--no-save-model", "--no-progress", "--output-dir", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"memory plan for 1200 MiB: micro-batch \d+ x \d+ accumulated", done.stdout)
    peak = int(re.search(r"peak RSS (\d+) MiB \(budget 1200 MiB\)", done.stdout).group(1))
    assert 0 < peak <= 1200
