"""The memory budget: the planner's rules, micro-batches that give the batch's update, the CLI's refusal."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

import far
from far.config import FARConfig
from far.training.batches import split_batch
from far.training.budget import (
    BASE_MIB,
    RECOMPUTE_LAYERS_TIME,
    MemoryBudgetError,
    ModelShape,
    _token_time,
    estimate_mib,
    plan_memory,
)
from far.training.recompute import recomputes_layers

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


BASE = BASE_MIB["lean"]


def plan(budget, far_config, **TINY_RUN):
    return plan_memory(budget, MINILM, base_mib=BASE, batch_size=32, seq_len=128, far=far_config, **TINY_RUN)


@pytest.mark.parametrize("far_config", [None, FARConfig(0.2, freeze_embeddings=True)])
def test_more_budget_never_gives_a_slower_plan(far_config):
    slowest = None
    for budget in range(500, 3000, 25):
        try:
            chosen = plan(budget, far_config)
        except MemoryBudgetError:
            assert slowest is None, "a budget refused after a smaller one fitted"
            continue
        tokens = chosen.micro_tokens or 32 * 128
        time = _token_time(tokens) * (RECOMPUTE_LAYERS_TIME if chosen.recompute_layers else 1.0)
        assert chosen.estimate_mib <= budget, f"the plan for {budget} MiB estimates {chosen.estimate_mib}"
        assert slowest is None or time <= slowest + 1e-9
        assert tokens % 128 == 0 and tokens <= 32 * 128
        if slowest is None:
            first_fit = budget
        slowest = time
    assert 500 < first_fit < 3000  # the sweep saw both a refusal and a plan
    assert chosen.micro_tokens is None and not chosen.recompute_layers  # roomy: whole batches, no lever


def test_refusal_names_the_smallest_budget_that_fits():
    far_config = FARConfig(0.2, freeze_embeddings=True)
    with pytest.raises(MemoryBudgetError, match=r"the smallest that fits is (\d+) MiB") as info:
        plan(300, far_config)
    minimum = info.value.minimum_mib
    least = plan(minimum, far_config)
    assert least.micro_tokens == 128 and least.recompute_layers and least.eval_batch_size == 1
    with pytest.raises(MemoryBudgetError):
        plan(minimum - 1, far_config)


def test_levers_are_turned_on_cheapest_first():
    far_config = FARConfig(0.2, freeze_embeddings=True, recompute_activations=False)  # every lever off to begin with
    roomy = plan(10_000, far_config)
    assert (roomy.micro_tokens, roomy.early_frozen_embeddings, roomy.recompute_activations) == (None, False, False)
    tight = plan(700, far_config)
    assert tight.early_frozen_embeddings and tight.micro_tokens is not None
    kwargs = dict(base_mib=BASE, seq_len=128, micro_tokens=512, eval_batch_size=8, far=far_config)
    assert estimate_mib(MINILM, early_frozen_embeddings=True, **kwargs) < estimate_mib(MINILM, **kwargs)
    assert estimate_mib(MINILM, recompute_layers=True, **kwargs) < estimate_mib(MINILM, **kwargs)
    assert estimate_mib(MINILM, primer_copy=False, **kwargs) < estimate_mib(MINILM, **kwargs)


def test_a_run_that_freezes_its_embeddings_from_the_start_plans_so():
    far_config = FARConfig(0.2, freeze_embeddings=True)
    assert plan(2000, far_config, early_frozen_embeddings=True).early_frozen_embeddings


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="positive number of MiB"):
        plan(-1, None)


def test_split_batch_keeps_every_example_once_under_the_token_cap():
    lengths = [5, 30, 10, 12, 7, 31, 2]
    groups = split_batch(lengths, max_tokens=40)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 40
    assert split_batch([200, 3], max_tokens=128) == [[0], [1]]  # a long example goes alone
    assert split_batch([8] * 4, max_tokens=16) == [[0, 1], [2, 3]]


def _tiny():
    # conftest's tiny BERT, narrower (its activations then dominate the estimate) and without dropout
    return tiny_model(
        "bert",
        num_labels=2,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=50,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _examples(n: int = 16, lengths=(8,)):
    g = torch.Generator().manual_seed(1)
    examples = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        examples.append(
            {
                "input_ids": torch.randint(1, 50, (length,), generator=g),
                "attention_mask": torch.ones(length, dtype=torch.long),
                "labels": torch.tensor(i % 2),
            }
        )
    return examples


def _pad(examples):
    longest = max(len(e["input_ids"]) for e in examples)
    pad = lambda t: torch.nn.functional.pad(t, (0, longest - len(t)))  # noqa: E731
    return {
        "input_ids": torch.stack([pad(e["input_ids"]) for e in examples]),
        "attention_mask": torch.stack([pad(e["attention_mask"]) for e in examples]),
        "labels": torch.stack([e["labels"] for e in examples]),
    }


# Two steps of conftest's narrow tiny BERT, unbudgeted or with a budget that only its activations fill.
TINY_RUN = dict(config=None, batch_size=8, max_steps=2, lr=1e-2, progress=False, collate_fn=_pad)


@pytest.fixture
def activations_only(monkeypatch):
    """Budgets planned on activations alone: no process base, and activations that dwarf the tiny weights (the
    unbudgeted runs do not plan, so they are unchanged)."""
    finetune_module = importlib.import_module("far.training.finetune")  # the module, not the function it exports
    monkeypatch.setattr(finetune_module, "process_base_mib", lambda resident, weights, dynamo: 0.0)
    monkeypatch.setattr("far.training.budget.ACTIVATION_FACTOR", 1e5)


@pytest.mark.parametrize("lengths", [(8,), (8, 3, 5, 2)])
def test_micro_batches_give_the_batch_update(activations_only, lengths):
    """A batch of 8 as accumulated micro-batches of at most 16 tokens takes the same optimizer steps (allclose)."""
    data = _examples(lengths=lengths)
    one, micro = _tiny(), _tiny()
    far.finetune(one, data, **TINY_RUN)
    # A budget that plans micro-batches of 16 tokens for this tiny model: the activations are the only large part.
    shape = ModelShape.from_config(micro.config)
    common = dict(base_mib=0.0, seq_len=8, eval_batch_size=1, far=None)
    two, four = (estimate_mib(shape, micro_tokens=t, **common) for t in (16, 32))
    budget = (two + four) / 2  # fits micro-batches of 16 tokens, not of 32
    assert plan_memory(budget, shape, batch_size=8, **common).micro_tokens == 16
    far.finetune(micro, data, memory_budget=budget, max_length=8, **TINY_RUN)
    for (name, a), b in zip(one.named_parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_the_smallest_budget_recomputes_layers_and_gives_the_model_back_as_it_came(activations_only):
    """The least budget that fits turns on layer recompute for the run (same update), and off again after it."""
    data = _examples(lengths=(8,))
    one, tight = _tiny(), _tiny()
    far.finetune(one, data, **TINY_RUN)
    with pytest.raises(MemoryBudgetError) as info:
        far.finetune(tight, data, memory_budget=1e-3, max_length=8, **TINY_RUN)
    result = far.finetune(tight, data, memory_budget=info.value.minimum_mib, max_length=8, **TINY_RUN)
    assert result.memory_plan["recompute_layers"]
    assert not recomputes_layers(tight)
    for (name, a), b in zip(one.named_parameters(), tight.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
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
    assert re.search(r"memory budget 1200 MiB: fits on the lean runtime .*evaluation batch \d+", done.stdout)
    assert re.search(r"memory plan for 1200 MiB: (whole batches|micro-batches of at most \d+ tokens)", done.stderr)
    peak = int(re.search(r"peak RSS (\d+) MiB \(budget 1200 MiB\)", done.stdout).group(1))
    assert 0 < peak <= 1200
