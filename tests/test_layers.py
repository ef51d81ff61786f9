from __future__ import annotations

import gc
import weakref

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
    torch.testing.assert_close(split_down.learner_weight.grad, down.weight.grad[:, learners].t())  # nodes as rows
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


def _ffn_pair(d=16, n=24, d_out=8, learners=None, recompute=False, act=torch.relu):
    torch.manual_seed(0)
    up, down = nn.Linear(d, n), nn.Linear(n, d_out)
    learners = torch.arange(0, n, 3) if learners is None else learners
    split_up = SplitLinear.from_linear(up, learners, "input")
    split_down = SplitLinear.from_linear(down, learners, "output", recompute=recompute)
    return up, down, split_up, split_down, learners


def _is_one_storage(split: SplitLinear) -> bool:
    learn, frozen = split.learner_weight, split.frozen_weight
    return (
        learn.untyped_storage().data_ptr() == frozen.untyped_storage().data_ptr()
        and frozen.data_ptr() == learn.data_ptr() + learn.numel() * learn.element_size()
    )


def test_learner_and_frozen_rows_share_one_storage_learners_first():
    up, down, split_up, split_down, learners = _ffn_pair()
    for split in (split_up, split_down):
        assert _is_one_storage(split)
        assert split.learner_weight.is_contiguous() and split.frozen_weight.is_contiguous()
    assert split_up.learner_bias.data_ptr() + split_up.learner_bias.nbytes == split_up.frozen_bias.data_ptr()
    torch.testing.assert_close(split_down.learner_weight, down.weight[:, learners].t(), atol=0, rtol=0)


def test_forward_passes_copy_no_weight():
    """Neither a no-grad nor a training forward allocates anything of a weight's size."""
    _, _, split_up, split_down, _ = _ffn_pair(d=64, n=256, d_out=64)
    x = torch.randn(2, 64, requires_grad=True)

    def largest_allocation(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        return max(sizes, default=0)

    weight_bytes = 64 * 256 * 4
    with torch.no_grad():
        assert largest_allocation(lambda: split_down(torch.relu(split_up(x)))) < weight_bytes / 4
    assert largest_allocation(lambda: split_down(torch.relu(split_up(x)))) < weight_bytes / 4


def test_learner_updates_do_not_touch_frozen_version():
    _, _, split_up, _, _ = _ffn_pair()
    before = split_up.frozen_weight._version
    with torch.no_grad():
        split_up.learner_weight.add_(1.0)
    assert split_up.frozen_weight._version == before


def test_a_forward_leaves_parts_with_storages_of_their_own_where_they_are():
    """FSDP2 gathers each parameter into a buffer of its own and writes the next step's values there: a forward that
    moved the parts into one storage of its own would train on the values of the step it moved them."""
    up, down, split_up, split_down, _ = _ffn_pair()
    x = torch.randn(5, 16)
    for split in (split_up, split_down):
        split.learner_weight.data = split.learner_weight.detach().clone()
    where = [split.learner_weight.data_ptr() for split in (split_up, split_down)]
    torch.testing.assert_close(split_down(torch.relu(split_up(x))), down(torch.relu(up(x))), atol=1e-6, rtol=0)
    assert [split.learner_weight.data_ptr() for split in (split_up, split_down)] == where
    with torch.no_grad():  # a write into the part's own storage is what the next forward computes with
        split_up.learner_weight.add_(1.0)
        up.weight[split_up.node_order[: split_up.n_learners]] += 1.0
    torch.testing.assert_close(split_down(torch.relu(split_up(x))), down(torch.relu(up(x))), atol=1e-5, rtol=0)


@pytest.mark.parametrize("how", ["deepcopy", "to", "assign"])
def test_parts_are_joined_again_after_they_were_separated(how):
    import copy

    up, down, split_up, split_down, _ = _ffn_pair()
    x = torch.randn(5, 16)
    expected = down(torch.relu(up(x)))
    if how == "deepcopy":
        split_up, split_down = copy.deepcopy(split_up), copy.deepcopy(split_down)
    elif how == "to":
        split_up, split_down = split_up.double().float(), split_down.double().float()
    else:
        for split in (split_up, split_down):
            split.load_state_dict({k: v.clone() for k, v in split.state_dict().items()}, assign=True)
    optimizer_view = split_up.learner_weight  # the Parameter object an optimizer would hold
    out = split_down(torch.relu(split_up(x)))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert _is_one_storage(split_up) and _is_one_storage(split_down)
    assert split_up.learner_weight is optimizer_view


def _saved_bytes(fn, *modules):
    """What autograd keeps during fn(), once per storage, leaving out the modules' parameters."""
    params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    storages = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


@pytest.mark.parametrize("act", [torch.relu, torch.nn.functional.gelu, torch.nn.functional.silu])
@pytest.mark.parametrize("recompute", [False, True])
def test_output_projection_keeps_only_the_learners_activation(act, recompute):
    up, down, split_up, split_down, _ = _ffn_pair(
        d=32, n=96, d_out=32, learners=torch.arange(0, 96, 4), recompute=recompute
    )
    for p in (*up.parameters(), *down.parameters(), *split_up.parameters(), *split_down.parameters()):
        p.requires_grad_(False)
    split_down.learner_weight.requires_grad_(True)
    down.weight.requires_grad_(True)
    a = torch.randn(64, 96)
    a_plain, a_split = a.clone().requires_grad_(), a[:, split_down.node_order].requires_grad_()  # stored order
    _, act_kept = _saved_bytes(lambda: act(a_plain))
    (_, plain), (out, split) = (
        _saved_bytes(lambda: down(act(a_plain)), down),
        _saved_bytes(lambda: split_down(act(a_split)), split_down),
    )
    full_copy, learner_copy = 64 * 96 * 4, 64 * 24 * 4
    keeps_its_output = act is torch.relu
    assert plain == (act_kept if keeps_its_output else act_kept + full_copy)  # nn.Linear keeps the whole activation
    # a view of what ReLU keeps is free; otherwise a copy of the learners' part, or nothing with recompute
    assert split == act_kept + (0 if recompute or keeps_its_output else learner_copy)
    out.pow(2).sum().backward()
    down(act(a_plain)).pow(2).sum().backward()
    torch.testing.assert_close(split_down.learner_weight.grad, down.weight.grad[:, ::4].t(), atol=1e-5, rtol=1e-5)


def test_recompute_rebuilds_a_gated_product():
    torch.manual_seed(0)
    gate, up, down = nn.Linear(8, 12), nn.Linear(8, 12), nn.Linear(12, 8)
    learners = torch.tensor([0, 5, 7, 11])
    s_gate, s_up = (SplitLinear.from_linear(m, learners, "input") for m in (gate, up))
    s_down = SplitLinear.from_linear(down, learners, "output", recompute=True)
    x = torch.randn(3, 8)
    s_down(torch.nn.functional.silu(s_gate(x)) * s_up(x)).pow(2).sum().backward()
    down(torch.nn.functional.silu(gate(x)) * up(x)).pow(2).sum().backward()
    for split, plain in ((s_gate, gate), (s_up, up)):
        torch.testing.assert_close(split.learner_weight.grad, plain.weight.grad[learners], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_down.learner_weight.grad, down.weight.grad[:, learners].t(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backward_layout", [False, True])
def test_bf16_cache_is_reused_for_frozen_and_refreshed_for_learners(backward_layout, monkeypatch):
    import far.layers

    monkeypatch.setattr(far.layers, "native_bf16", lambda: not backward_layout)
    up, down, split_up, split_down, learners = _ffn_pair()
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        split_down(torch.relu(split_up(x))).float().sum().backward()
    cached = {name: value.data_ptr() for name, (_, value) in split_up._cache.items()}
    assert ("backward" in cached) == backward_layout
    with torch.no_grad():
        split_up.learner_weight.add_(0.5)
        up.weight[learners] += 0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = split_down(torch.relu(split_up(x)))
        ref = down(torch.relu(up(x)))
    assert {name: value.data_ptr() for name, (_, value) in split_up._cache.items()} == cached  # no new cast copy
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    out.float().sum().backward()


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(use_reentrant, recompute):
    from torch.utils.checkpoint import checkpoint

    _, _, split_up, split_down, _ = _ffn_pair(recompute=recompute)
    x = torch.randn(5, 16, requires_grad=True)

    def ffn(inp):
        return split_down(torch.nn.functional.gelu(split_up(inp)))

    ffn(x).pow(2).sum().backward()
    expected = [t.grad.clone() for t in (x, split_up.learner_weight, split_down.learner_weight)]
    for t in (x, split_up.learner_weight, split_down.learner_weight):
        t.grad = None
    checkpoint(ffn, x, use_reentrant=use_reentrant).pow(2).sum().backward()
    for got, want in zip((x, split_up.learner_weight, split_down.learner_weight), expected, strict=True):
        torch.testing.assert_close(got.grad, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_a_training_step_keeps_no_activation_once_it_is_done(recompute, autocast):
    """Nothing outlives a step: no input of a split projection stays referenced after backward (an input kept by a
    cache or a closure would grow memory by one activation per layer per step)."""
    torch.manual_seed(0)
    up = SplitLinear.from_linear(nn.Linear(6, 10), torch.tensor([0, 3, 9]), "input")
    down = SplitLinear.from_linear(nn.Linear(10, 4), torch.tensor([0, 3, 9]), "output", recompute=recompute)
    seen: list[weakref.ref] = []
    for layer in (up, down):
        layer.register_forward_pre_hook(lambda _, args: seen.append(weakref.ref(args[0])))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    for _ in range(2):
        x = torch.randn(5, 6, requires_grad=True)
        with context:
            loss = down(torch.nn.functional.gelu(up(x))).float().sum()
        loss.backward()
        del x, loss
    gc.collect()
    assert len(seen) == 4 and all(ref() is None for ref in seen)
