"""FAR with freeze_layers: outputs unchanged, the bottom layers frozen whole, backward stopping above them."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, tiny_batch, tiny_model

import far
from far.freezing import find_layers
from far.layers import SplitLinear
from far.selection import auto_freeze_layers

LABELS = torch.tensor([0, 1, 2])
DEPTH_ARCHS = ["bert", "llama"]


def deep(arch: str, layers: int = 4, seed: int = 0) -> torch.nn.Module:
    return tiny_model(arch, seed=seed, num_hidden_layers=layers)


def scores_of(model, seed: int = 5) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.rand(f.n_nodes, generator=generator) for name, f in far.find_ffns(model).items()}


def layers_of(model) -> list[str]:
    return find_layers(model)


def embeddings_of(model) -> list[torch.nn.Parameter]:
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]


def snapshot(model) -> tuple:
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [(n, type(m)) for n, m in model.named_modules()],
        [(n, p.requires_grad) for n, p in model.named_parameters()],
    )


def assert_untouched(model, before) -> None:
    state, modules, grads = before
    assert [(n, type(m)) for n, m in model.named_modules()] == modules
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == grads
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not hasattr(model, "far_state")


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(**tiny_batch()).logits


@pytest.mark.parametrize("arch", DEPTH_ARCHS)
@pytest.mark.parametrize("selection", ["per_layer", "global", "random"])
def test_outputs_unchanged_and_restore_is_exact(arch, selection):
    model = deep(arch)
    before, plain = logits(model), snapshot(model)
    far.reconfigure(model, 0.4, scores=scores_of(model), selection=selection, freeze_layers=2)
    torch.testing.assert_close(logits(model), before, atol=1e-5, rtol=0)
    counts = [v.numel() for v in far.learners(model).values()]
    assert counts[:2] == [0, 0] and sum(counts) == round(0.4 * 4 * 40)
    assert far.get_config(model).freeze_layers == 2 and model.far_state.frozen_layers == 2
    far.restore(model)
    assert_untouched(model, plain)
    assert torch.equal(logits(model), before)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_backward_stops_at_the_lowest_trainable_layer(arch):
    model = far.reconfigure(tiny_model(arch).train(), 0.4, selection="random", freeze_layers=1)
    bottom, top = (model.get_submodule(name) for name in layers_of(model))
    seen = {}

    def inputs(module, args, kwargs):  # what enters the lowest trainable layer
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        seen["input"] = [t.requires_grad for t in tensors]

    def outputs(module, args, output):
        flat = output if isinstance(output, tuple) else (output,)
        seen["output"] = [t.requires_grad for t in flat if isinstance(t, torch.Tensor)]

    hooks = [top.register_forward_pre_hook(inputs, with_kwargs=True), bottom.register_forward_hook(outputs)]
    model(**tiny_batch(), labels=LABELS).loss.backward()
    for hook in hooks:
        hook.remove()
    assert seen["input"] and not any(seen["input"])  # no graph below: autograd stops at layer 1
    assert seen["output"] and not any(seen["output"])
    for name, p in model.named_parameters():
        if name.startswith(f"{layers_of(model)[0]}.") or any(p is e for e in embeddings_of(model)):
            assert p.grad is None and not p.requires_grad, name
    learners = [m.learner_weight for n, m in model.named_modules() if isinstance(m, SplitLinear) and m.n_learners]
    assert learners and all(w.grad is not None and w.grad.abs().sum() > 0 for w in learners)


@pytest.mark.parametrize("arch", DEPTH_ARCHS)
def test_gradients_land_only_above_the_frozen_layers(arch):
    model = far.reconfigure(deep(arch).train(), 0.4, scores=scores_of(deep(arch)), freeze_layers=2)
    model(**tiny_batch(), labels=LABELS).loss.backward()
    bottom = tuple(f"{name}." for name in layers_of(model)[:2])
    top = tuple(f"{name}." for name in layers_of(model)[2:])
    for name, p in model.named_parameters():
        if name.startswith(bottom) or any(p is e for e in embeddings_of(model)):
            assert not p.requires_grad and p.grad is None, name
        elif name.startswith(top) and p.requires_grad:
            assert p.grad is not None, name
    assert not any(p.requires_grad for n, p in model.named_parameters() if "embed" in n)  # norms below too


def test_freeze_layers_zero_freezes_only_what_is_below_the_layers():
    model = far.reconfigure(deep("bert"), 0.4, selection="random", freeze_layers=0)
    assert not model.bert.embeddings.LayerNorm.weight.requires_grad  # below layer 0, unlike freeze_embeddings
    assert all(v.numel() > 0 for v in far.learners(model).values())
    assert model.bert.encoder.layer[0].attention.self.query.weight.requires_grad


def test_auto_uses_the_priming_scores_and_records_the_depth():
    model = deep("llama")
    scores = scores_of(model)
    first = next(iter(scores))
    scores[first] = scores[first] * 0.01  # the bottom layer barely moved
    far.reconfigure(model, 0.4, scores=scores, freeze_layers="auto")
    assert model.far_state.frozen_layers == auto_freeze_layers(scores) == 1
    assert far.get_config(model).freeze_layers == "auto"
    assert far.learners(model)[first].numel() == 0


def test_auto_right_after_priming_and_with_random_selection():
    model = deep("bert").train()
    primer = far.Primer(model, everything=True)  # depth freezes whole layers: their pre-priming values
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for seed in range(2):
        model(**tiny_batch(seed=seed), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = auto_freeze_layers(primer.scores())
    far.reconfigure(model, 0.4, selection="random", freeze_layers="auto")  # the depth still comes from the scores
    assert model.far_state.frozen_layers == expected


def test_split_attention_freezes_with_the_same_layers():
    model = far.reconfigure(deep("llama"), 0.4, selection="random", attention_retention=0.5, freeze_layers=1)
    chosen = far.learners(model)
    assert (
        chosen["model.layers.0.self_attn.o_proj"].numel() == 0 and chosen["model.layers.0.mlp.down_proj"].numel() == 0
    )
    assert all(chosen[f"model.layers.{i}.self_attn.o_proj"].numel() > 0 for i in (1, 2, 3))
    torch.testing.assert_close(logits(model), logits(deep("llama")), atol=1e-5, rtol=0)


def test_restore_unfreezes_exactly_what_far_froze():
    model = deep("bert")
    mine = model.bert.encoder.layer[0].attention.self.query.weight
    mine.requires_grad_(False)  # the user's own choice, in a layer FAR will freeze
    model.bert.embeddings.token_type_embeddings.weight.requires_grad_(False)
    before = [(n, p.requires_grad) for n, p in model.named_parameters()]
    far.reconfigure(model, 0.4, selection="random", freeze_layers=2)
    assert "bert.encoder.layer.0.attention.self.query.weight" not in model.far_state.frozen_parameters
    far.restore(model)
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == before


def test_summary_shows_the_frozen_layers(capsys):
    model = far.reconfigure(deep("bert", layers=6), 0.4, selection="random", freeze_layers=3)
    result = far.summary(model)
    assert result.frozen_layers == (3, 6, True)
    assert "frozen layers: 0-2 (3 of 6), backward stops at layer 3" in capsys.readouterr().out
    assert far.summary(deep("bert"), verbose=False).frozen_layers == (0, 4, False)


# ---- bad input: a clear error, and the model exactly as it was ----


@pytest.mark.parametrize("arch", DEPTH_ARCHS)
def test_freezing_every_layer_is_refused_and_model_untouched(arch):
    model = deep(arch)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"has 4 layers and at least one must keep learners; use freeze_layers <= 3"):
        far.reconfigure(model, 0.4, selection="random", freeze_layers=4)
    assert_untouched(model, before)


def test_bad_freeze_layers_is_refused_before_the_model_is_touched():
    model = deep("bert")
    before = snapshot(model)
    with pytest.raises(TypeError, match="freeze_layers must be None, an int >= 0 or 'auto'"):
        far.reconfigure(model, 0.4, selection="random", freeze_layers=True)
    with pytest.raises(ValueError, match="freeze_layers must be >= 0"):
        far.reconfigure(model, 0.4, selection="random", freeze_layers=-1)
    assert_untouched(model, before)


def test_auto_without_priming_is_refused():
    model = deep("bert")
    before = snapshot(model)
    with pytest.raises(ValueError, match="freeze_layers='auto' needs priming scores.*or give freeze_layers an int"):
        far.reconfigure(model, 0.4, selection="random", freeze_layers="auto")
    assert_untouched(model, before)


def test_a_model_without_numbered_layers_is_refused():
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(4, 6), torch.nn.Linear(6, 4)

    model = torch.nn.Module()
    model.ffn = Block()
    spec = far.FFNSpec(inputs=("fc1",), output="fc2")
    with pytest.raises(ValueError, match="carries no layer index.*numbered stack of layers"):
        far.reconfigure(model, 0.5, selection="random", freeze_layers=0, spec=spec)
    assert not far.is_reconfigured(model)
