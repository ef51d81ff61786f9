from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from far.layers import SplitLinear


@pytest.mark.parametrize("role", ["input", "output"])
@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_to_linear_round_trip_is_exact(role, bias):
    torch.manual_seed(0)
    linear = nn.Linear(6, 10, bias=bias) if role == "input" else nn.Linear(10, 6, bias=bias)
    split = SplitLinear.from_linear(linear, torch.tensor([1, 4, 7]), role)
    assert split.node_order.tolist()[:3] == [1, 4, 7] and sorted(split.node_order.tolist()) == list(range(10))
    assert split.learner_indices().tolist() == [1, 4, 7]
    back = split.to_linear()
    assert type(back) is nn.Linear and torch.equal(back.weight, linear.weight)
    assert (back.bias is None) == (not bias) and (not bias or torch.equal(back.bias, linear.bias))


def test_input_and_output_split_compose_to_the_original_ffn():
    torch.manual_seed(0)
    up, down = nn.Linear(6, 10), nn.Linear(10, 4)
    learners = torch.tensor([0, 3, 9])
    split_up, split_down = (
        SplitLinear.from_linear(up, learners, "input"),
        SplitLinear.from_linear(down, learners, "output"),
    )
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(split_down(torch.relu(split_up(x))), down(torch.relu(up(x))), atol=1e-6, rtol=0)


def test_weight_gradients_are_those_of_the_learner_nodes():
    torch.manual_seed(0)
    up, down = nn.Linear(6, 10), nn.Linear(10, 4)
    learners = torch.tensor([2, 5, 6, 8])
    split_up, split_down = (
        SplitLinear.from_linear(up, learners, "input"),
        SplitLinear.from_linear(down, learners, "output"),
    )
    x = torch.randn(3, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    split_down(torch.tanh(split_up(x))).pow(2).sum().backward()
    down(torch.tanh(up(x_ref))).pow(2).sum().backward()
    torch.testing.assert_close(split_up.learner_weight.grad, up.weight.grad[learners])
    torch.testing.assert_close(split_up.learner_bias.grad, up.bias.grad[learners])
    torch.testing.assert_close(split_down.learner_weight.grad, down.weight.grad[:, learners])
    torch.testing.assert_close(split_down.bias.grad, down.bias.grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert split_up.frozen_weight.grad is None and split_down.frozen_weight.grad is None


def test_gradcheck_in_double():
    torch.manual_seed(0)
    up = SplitLinear.from_linear(nn.Linear(3, 5).double(), torch.tensor([0, 2]), "input")
    down = SplitLinear.from_linear(nn.Linear(5, 2).double(), torch.tensor([0, 2]), "output")
    x = torch.randn(4, 3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *_: down(torch.sin(up(x))), (x, up.learner_weight, down.learner_weight))


def test_conv1d_round_trip_and_forward():
    torch.manual_seed(0)
    conv = Conv1D(10, 6)  # 6 -> 10, weight (6, 10)
    split = SplitLinear.from_linear(conv, torch.tensor([1, 2]), "input")
    x = torch.randn(2, 6)
    # alone, a split layer emits its nodes in stored [learners | frozen] order
    torch.testing.assert_close(split(x), conv(x)[:, split.node_order], atol=1e-6, rtol=0)
    back = split.to_linear()
    assert type(back) is Conv1D and torch.equal(back.weight, conv.weight) and torch.equal(back.bias, conv.bias)


def test_output_bias_is_shared_not_copied():
    linear = nn.Linear(10, 4)
    split = SplitLinear.from_linear(linear, torch.tensor([0]), "output")
    assert split.bias is linear.bias


def test_no_grad_forward_builds_no_graph():
    split = SplitLinear.from_linear(nn.Linear(6, 10), torch.tensor([1, 2]), "input")
    with torch.no_grad():
        y = split(torch.randn(2, 6))
    assert y.grad_fn is None


def test_bad_role():
    with pytest.raises(ValueError, match="role must be"):
        SplitLinear.from_linear(nn.Linear(2, 3), torch.tensor([0]), "middle")


def test_autocast_bf16_matches_the_plain_layer_and_grads_keep_the_weight_dtype():
    torch.manual_seed(0)
    up, down = nn.Linear(16, 24), nn.Linear(24, 8)
    learners = torch.arange(0, 24, 3)
    split_up, split_down = (
        SplitLinear.from_linear(up, learners, "input"),
        SplitLinear.from_linear(down, learners, "output"),
    )
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = split_down(torch.relu(split_up(x)))
        ref = down(torch.relu(up(x)))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, atol=0, rtol=0)  # same bf16 products, same order
    out.float().sum().backward()
    assert split_up.learner_weight.grad.dtype == torch.float32 and split_down.learner_weight.grad.dtype == torch.float32


def test_cached_frozen_cast_follows_changes_to_the_frozen_weight():
    torch.manual_seed(0)
    split = SplitLinear.from_linear(nn.Linear(6, 10), torch.tensor([1, 2]), "input")
    x = torch.randn(3, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = split(x)
    state = {k: v.clone() for k, v in split.state_dict().items()}
    state["frozen_weight"].mul_(2)
    split.load_state_dict(state)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        second = split(x)
    assert not torch.equal(first[:, 2:], second[:, 2:])  # frozen rows follow the new values
    expected = torch.nn.functional.linear(
        x.bfloat16(),
        torch.cat([split.learner_weight, split.frozen_weight]).bfloat16(),
        torch.cat([split.learner_bias, split.frozen_bias]).bfloat16(),
    )
    torch.testing.assert_close(second, expected, atol=0, rtol=0)
