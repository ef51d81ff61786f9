"""Parity tests at the centre: reconfigure changes nothing observable but what trains."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import ARCHITECTURES, tiny_batch, tiny_model

import far
from far.layers import SplitLinear
from far.surgery import learners_from_state_dict, reconfigure_with_learners


def _logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


def _scores(model):
    generator = torch.Generator().manual_seed(5)
    return {name: torch.rand(f.n_nodes, generator=generator) for name, f in far.find_ffns(model).items()}


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m) for m in model.modules()]


def _assert_untouched(model, snapshot):
    state, types = snapshot
    assert [type(m) for m in model.modules()] == types
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not hasattr(model, "far_state")


@pytest.mark.parametrize("selection", ["per_layer", "global", "random"])
def test_outputs_unchanged_and_restore_is_exact(arch, selection):
    model = tiny_model(arch)
    batch = tiny_batch()
    before = _logits(model, batch)
    state, types = _snapshot(model)

    far.reconfigure(model, 0.4, scores=_scores(model), selection=selection)
    assert any(isinstance(m, SplitLinear) for m in model.modules())
    torch.testing.assert_close(_logits(model, batch), before, atol=1e-5, rtol=0)

    far.restore(model)
    _assert_untouched(model, (state, types))
    assert torch.equal(_logits(model, batch), before)


def test_state_dict_of_restored_model_loads_into_a_fresh_one(arch):
    model = far.restore(far.reconfigure(tiny_model(arch), 0.5, selection="random"))
    fresh = tiny_model(arch, seed=1)
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(_logits(fresh, tiny_batch()), _logits(model, tiny_batch()))


def _frozen_mask_grads(model, learners):
    """Zero the gradients of frozen nodes in a plain model (the reference for FAR's update)."""
    for name, ffn in far.find_ffns(model).items():
        keep = torch.zeros(ffn.n_nodes, dtype=torch.bool)
        keep[learners[name]] = True
        for proj in ffn.inputs:
            module = model.get_submodule(proj)
            if isinstance(module, torch.nn.Linear):
                module.weight.grad[~keep] = 0
            else:  # Conv1D: (in, out), nodes are columns
                module.weight.grad[:, ~keep] = 0
            if module.bias is not None:
                module.bias.grad[~keep] = 0
        out = model.get_submodule(name)
        if isinstance(out, torch.nn.Linear):
            out.weight.grad[:, ~keep] = 0
        else:
            out.weight.grad[~keep] = 0


@pytest.mark.parametrize("freeze_embeddings", [False, True])
def test_one_sgd_step_matches_masked_step_on_the_original(arch, freeze_embeddings):
    reference = tiny_model(arch).train()
    model = copy.deepcopy(reference)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    torch.manual_seed(0)  # dropout masks: same draw in both runs

    far.reconfigure(model, 0.4, scores=_scores(model), freeze_embeddings=freeze_embeddings)
    learners = far.learners(model)
    torch.manual_seed(0)
    model(**batch).loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    far.restore(model)

    torch.manual_seed(0)
    reference(**batch).loss.backward()
    _frozen_mask_grads(reference, learners)
    if freeze_embeddings:
        for module in reference.modules():
            if isinstance(module, torch.nn.Embedding):
                module.weight.grad = None
    torch.optim.SGD(reference.parameters(), lr=0.5).step()

    trained, expected = model.state_dict(), reference.state_dict()
    assert list(trained) == list(expected)
    for key in expected:
        torch.testing.assert_close(trained[key], expected[key], atol=1e-6, rtol=1e-5, msg=key)
    original = tiny_model(arch).state_dict()
    changed = [k for k in expected if not torch.equal(expected[k], original[k])]
    assert any(".weight" in k for k in changed)  # the step really moved something


def test_frozen_sublayer_never_gets_a_gradient(arch):
    model = far.reconfigure(tiny_model(arch).train(), 0.3, selection="random")
    model(**tiny_batch(), labels=torch.tensor([0, 1, 2])).loss.backward()
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    for module in model.modules():
        if isinstance(module, SplitLinear):
            frozen = [module.frozen_weight] + (
                [module.frozen_bias] if module.role == "input" and module.frozen_bias is not None else []
            )
            for p in frozen:
                assert not p.requires_grad and p.grad is None and id(p) not in trainable
            assert module.learner_weight.grad is not None and module.learner_weight.grad.abs().sum() > 0


def test_everything_outside_the_ffns_keeps_requires_grad():
    model = tiny_model("bert")
    model.bert.encoder.layer[1].attention.self.query.weight.requires_grad_(False)  # the user's own choice
    ffn_modules = {n for f in far.find_ffns(model).values() for n in (*f.inputs, f.output)}
    before = {n: p.requires_grad for n, p in model.named_parameters() if n.rpartition(".")[0] not in ffn_modules}
    far.reconfigure(model, 0.4, selection="random")
    after = {n: p.requires_grad for n, p in model.named_parameters() if n.rpartition(".")[0] not in ffn_modules}
    assert after == before


def test_freeze_embeddings_freezes_and_restore_unfreezes():
    model = tiny_model("bert")
    far.reconfigure(model, 0.4, selection="random", freeze_embeddings=True)
    embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert len(embeddings) == 3 and not any(w.requires_grad for w in embeddings)
    assert model.bert.embeddings.LayerNorm.weight.requires_grad
    far.restore(model)
    assert all(w.requires_grad for w in embeddings)


def test_right_after_priming_reconfigure_needs_no_scores():
    model = tiny_model("bert").train()
    primer = far.Primer(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for seed in range(3):
        model(**tiny_batch(seed=seed), labels=torch.tensor([0, 1, 2])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = far.select_learners(0.4, scores=primer.scores())
    far.reconfigure(model, retention=0.4)
    assert {k: v.tolist() for k, v in far.learners(model).items()} == {k: v.tolist() for k, v in expected.items()}
    assert far.get_config(model) == far.FARConfig(retention=0.4)


def test_gpt2_conv1d_restores_to_conv1d():
    from transformers.pytorch_utils import Conv1D

    model = far.restore(far.reconfigure(tiny_model("gpt2"), 0.5, selection="random"))
    assert isinstance(model.transformer.h[0].mlp.c_fc, Conv1D)


def test_restored_weights_require_grad_and_model_trains_normally():
    model = far.restore(far.reconfigure(tiny_model("llama"), 0.4, selection="random"))
    assert all(p.requires_grad for p in model.parameters())


def test_bf16_autocast_training_step_runs_and_only_learners_move():
    model = far.reconfigure(tiny_model("bert").train(), 0.4, selection="random")
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    learner = model.bert.encoder.layer[0].intermediate.dense.learner_weight.clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**tiny_batch(), labels=torch.tensor([0, 1, 2])).loss
    loss.backward()
    optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert not torch.equal(model.bert.encoder.layer[0].intermediate.dense.learner_weight, learner)
    assert model.bert.encoder.layer[0].intermediate.dense.learner_weight.dtype == torch.float32


def test_retention_one_keeps_every_node_trainable():
    model = far.reconfigure(tiny_model("bert"), 1.0, selection="random")
    assert all(v.numel() == 40 for v in far.learners(model).values())
    model.train()(**tiny_batch(), labels=torch.tensor([0, 1, 2])).loss.backward()


# ---- bad input: a clear error, and the model exactly as it was ----

BAD_RETENTIONS = [
    (0.0, ValueError, "retention must be in \\(0, 1\\]"),
    (1.5, ValueError, "retention must be in"),
    (-0.1, ValueError, "retention must be in"),
    (float("nan"), ValueError, "retention must be in"),
    ("0.4", TypeError, "retention must be a number"),
    (True, TypeError, "retention must be a number"),
    (None, TypeError, "retention must be a number"),
]


@pytest.mark.parametrize("retention,error,message", BAD_RETENTIONS)
def test_bad_retention_is_refused_and_model_untouched(retention, error, message):
    model = tiny_model("bert")
    snapshot = _snapshot(model)
    with pytest.raises(error, match=message):
        far.reconfigure(model, retention, selection="random")
    _assert_untouched(model, snapshot)


def test_not_a_model_is_refused():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.reconfigure({"weights": 1}, 0.4, selection="random")
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.restore("model")


def _bad_scores(model):
    good = _scores(model)
    first = next(iter(good))
    wrong_key = dict(good)
    wrong_key["not.an.ffn"] = wrong_key.pop(first)
    return [
        (wrong_key, ValueError, "one entry per FFN"),
        ({k: v for k, v in good.items() if k != first}, ValueError, "missing"),
        (dict(good, **{first: torch.rand(7)}), ValueError, "1-D float tensor of 40"),
        (dict(good, **{first: torch.rand(40, 1)}), ValueError, "1-D float tensor"),
        (dict(good, **{first: torch.arange(40)}), ValueError, "float tensor"),
        (dict(good, **{first: torch.full((40,), float("nan"))}), ValueError, "NaN"),
        ([1, 2, 3], TypeError, "scores must be a dict"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_bad_scores_are_refused_and_model_untouched(case):
    model = tiny_model("bert")
    scores, error, message = _bad_scores(model)[case]
    snapshot = _snapshot(model)
    with pytest.raises(error, match=message):
        far.reconfigure(model, 0.4, scores=scores)
    _assert_untouched(model, snapshot)


def test_reconfiguring_twice_is_refused_and_model_untouched():
    model = far.reconfigure(tiny_model("bert"), 0.4, selection="random")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    types = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match="already reconfigured.*far.restore"):
        far.reconfigure(model, 0.5, selection="random")
    assert [type(m) for m in model.modules()] == types
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert far.get_config(model).retention == 0.4


def test_restoring_a_plain_model_is_refused():
    model = tiny_model("bert")
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match="never reconfigured"):
        far.restore(model)
    _assert_untouched(model, snapshot)


def test_unprimed_model_needs_scores_or_random():
    model = tiny_model("bert")
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match="far.Primer.*scores=.*selection='random'"):
        far.reconfigure(model, 0.4)
    _assert_untouched(model, snapshot)


def test_priming_without_training_steps_is_refused():
    model = tiny_model("bert")
    far.Primer(model)
    with pytest.raises(ValueError, match="every priming score is zero"):
        far.reconfigure(model, 0.4)
    assert not far.is_reconfigured(model)


def test_unknown_selection_is_refused():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="selection must be one of"):
        far.reconfigure(model, 0.4, selection="best")
    assert not far.is_reconfigured(model)


def test_learners_of_a_plain_model_is_refused():
    with pytest.raises(ValueError, match="not reconfigured"):
        far.learners(tiny_model("bert"))


def test_freeze_ffns_freezes_exactly_the_ffn_projections():
    model = far.freeze_ffns(tiny_model("llama"))
    ffn_modules = {n for f in far.find_ffns(model).values() for n in (*f.inputs, f.output)}
    for name, p in model.named_parameters():
        assert p.requires_grad == (name.rpartition(".")[0] not in ffn_modules), name


def test_reconfigure_with_learners_rebuilds_a_saved_layout():
    model = far.reconfigure(tiny_model("opt"), 0.4, scores=_scores(tiny_model("opt")))
    state = model.state_dict()
    fresh = tiny_model("opt", seed=3)
    reconfigure_with_learners(fresh, learners_from_state_dict(fresh, state), far.get_config(model))
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(_logits(fresh, tiny_batch()), _logits(model, tiny_batch()))
    assert {k: v.tolist() for k, v in far.learners(fresh).items()} == {
        k: v.tolist() for k, v in far.learners(model).items()
    }


@pytest.mark.parametrize(
    "learners,message",
    [
        ({}, "every FFN name"),
        (None, "every FFN name"),
    ],
)
def test_reconfigure_with_bad_learners_is_refused(learners, message):
    model = tiny_model("bert")
    with pytest.raises(ValueError, match=message):
        reconfigure_with_learners(model, learners, far.FARConfig())
    assert not far.is_reconfigured(model)


def test_reconfigure_with_out_of_range_learners_is_refused():
    model = tiny_model("bert")
    bad = {name: torch.tensor([0, 40]) for name in far.find_ffns(model)}
    with pytest.raises(ValueError, match=r"distinct node indices in \[0, 40\)"):
        reconfigure_with_learners(model, bad, far.FARConfig())
    dup = {name: torch.tensor([3, 3]) for name in far.find_ffns(model)}
    with pytest.raises(ValueError, match="distinct"):
        reconfigure_with_learners(model, dup, far.FARConfig())
    assert not far.is_reconfigured(model)


assert len(ARCHITECTURES) == 12
