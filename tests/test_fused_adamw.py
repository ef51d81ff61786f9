"""far's fused AdamW: torch.optim.AdamW(fused=True) bit for bit, checkpoints both ways, no torch._dynamo import."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from far.training.adamw import FusedAdamW
from far.training.schedule import RunSchedule, WarmupLinear, warmup_linear


def params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((7, 5), (5,), (3, 4, 2))]


def groups(ps):
    return [{"params": ps[::2], "weight_decay": 0.01}, {"params": ps[1:2], "weight_decay": 0.0}]


def steps(optimizer, ps, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
        optimizer.zero_grad()


def test_steps_equal_torchs_fused_adamw_bit_for_bit():
    ours, theirs = params(), params()
    steps(FusedAdamW(groups(ours), lr=1e-2), ours, 5)
    steps(torch.optim.AdamW(groups(theirs), lr=1e-2, fused=True), theirs, 5)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("first", ["ours", "torch"])
def test_a_state_dict_of_either_continues_in_the_other(first):
    make = {
        "ours": lambda ps: FusedAdamW(groups(ps), lr=1e-2),
        "torch": lambda ps: torch.optim.AdamW(groups(ps), lr=1e-2, fused=True),
    }
    second = "torch" if first == "ours" else "ours"
    a, b = params(), params()
    opt_a = make[first](a)
    steps(opt_a, a, 3)
    b_data = [p.detach().clone() for p in a]
    with torch.no_grad():
        for p, value in zip(b, b_data, strict=True):
            p.copy_(value)
    opt_b = make[second](b)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as a checkpoint's copy, not aliased
    steps(opt_a, a, 2, seed=9)
    steps(opt_b, b, 2, seed=9)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.filterwarnings("ignore:Detected call of")  # LambdaLR steps here with no optimizer step
def test_the_run_schedule_sets_the_rates_lambdalr_sets_and_reads_its_state():
    ours, theirs = FusedAdamW(groups(params()), lr=0.1), torch.optim.AdamW(groups(params()), lr=0.1)
    a, b = RunSchedule(ours, WarmupLinear(10, 3, offset=2)), warmup_linear(theirs, 10, 3, offset=2)
    for _ in range(6):
        assert a.get_last_lr() == pytest.approx(b.get_last_lr())
        a.step()
        b.step()
    again = RunSchedule(FusedAdamW(groups(params()), lr=0.1), WarmupLinear(10, 3))
    again.load_state_dict(b.state_dict())
    assert again.get_last_lr() == pytest.approx(b.get_last_lr())


def test_options_and_tensors_the_kernel_cannot_take_are_refused():
    with pytest.raises(ValueError, match="unknown AdamW options"):
        FusedAdamW(params(), lr=1e-3, amsgrad_please=True)
    with pytest.raises(ValueError, match="floating-point CPU or CUDA tensors"):
        FusedAdamW([torch.zeros(3, dtype=torch.long)], lr=1e-3)


@pytest.mark.slow
def test_finetune_imports_no_dynamo():
    code = (
        "import sys, torch\n"
        "from transformers import BertConfig\n"
        "import far\n"
        "from far.encoder import LeanBertForSequenceClassification\n"
        "torch.manual_seed(0)\n"
        "model = LeanBertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,"
        " num_attention_heads=2, intermediate_size=32, max_position_embeddings=16))\n"
        "data = [{'input_ids': torch.randint(1, 50, (6,)), 'labels': torch.tensor(i % 2)} for i in range(12)]\n"
        "far.finetune(model, data, far.FARConfig(0.5, freeze_embeddings=True), priming=1, max_steps=3,"
        " batch_size=4, progress=False)\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
