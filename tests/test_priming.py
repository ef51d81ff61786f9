from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

import far


def _train_steps(model, steps=2, lr=1e-2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for seed in range(steps):
        model(**tiny_batch(seed=seed), labels=torch.tensor([0, 1, 2])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_scores_equal_a_hand_computed_l1_bert():
    model = tiny_model("bert").train()
    layer = model.bert.encoder.layer[1]
    w_in, b_in, w_out = (
        t.detach().clone()
        for t in (layer.intermediate.dense.weight, layer.intermediate.dense.bias, layer.output.dense.weight)
    )
    primer = far.Primer(model)
    _train_steps(model)
    scores = primer.scores()
    w_in_now, b_in_now, w_out_now = (
        t.detach() for t in (layer.intermediate.dense.weight, layer.intermediate.dense.bias, layer.output.dense.weight)
    )
    assert list(scores) == [f"bert.encoder.layer.{i}.output.dense" for i in range(2)]
    expected = torch.tensor(
        [
            float(
                (w_in_now[i] - w_in[i]).abs().sum()
                + (b_in_now[i] - b_in[i]).abs()
                + (w_out_now[:, i] - w_out[:, i]).abs().sum()
            )
            for i in range(40)
        ]
    )
    torch.testing.assert_close(scores["bert.encoder.layer.1.output.dense"], expected)
    assert scores["bert.encoder.layer.1.output.dense"].dtype == torch.float32
    assert (expected > 0).all()


def test_scores_sum_both_input_projections_of_a_gated_mlp():
    model = tiny_model("llama").train()
    mlp = model.model.layers[0].mlp
    before = {n: getattr(mlp, n).weight.detach().clone() for n in ("gate_proj", "up_proj", "down_proj")}
    primer = far.Primer(model)
    _train_steps(model)
    expected = (
        (mlp.gate_proj.weight - before["gate_proj"]).abs().sum(1)
        + (mlp.up_proj.weight - before["up_proj"]).abs().sum(1)
        + (mlp.down_proj.weight - before["down_proj"]).abs().sum(0)
    ).detach()
    torch.testing.assert_close(primer.scores()["model.layers.0.mlp.down_proj"], expected)


def test_scores_follow_gpt2_conv1d_layout():
    model = tiny_model("gpt2").train()
    mlp = model.transformer.h[0].mlp
    fc, proj, fc_b = (
        mlp.c_fc.weight.detach().clone(),
        mlp.c_proj.weight.detach().clone(),
        mlp.c_fc.bias.detach().clone(),
    )
    primer = far.Primer(model)
    _train_steps(model)
    # Conv1D weights are (in, out): node i is column i of c_fc and row i of c_proj
    expected = (
        (mlp.c_fc.weight - fc).abs().sum(0) + (mlp.c_fc.bias - fc_b).abs() + (mlp.c_proj.weight - proj).abs().sum(1)
    ).detach()
    torch.testing.assert_close(primer.scores()["transformer.h.0.mlp.c_proj"], expected)


def test_snapshot_holds_only_ffn_weights_on_cpu_in_model_dtype():
    model = tiny_model("bert").to(torch.bfloat16)
    primer = far.Primer(model)
    assert all(t.device.type == "cpu" and t.dtype == torch.bfloat16 for t in primer._snapshot.values())
    assert sorted(primer._snapshot) == sorted(
        f"bert.encoder.layer.{i}.{n}"
        for i in range(2)
        for n in ("intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight")
    )


def test_untrained_scores_are_zero():
    model = tiny_model("bert")
    assert all((s == 0).all() for s in far.Primer(model).scores().values())


def test_priming_a_reconfigured_model_is_refused():
    model = far.reconfigure(tiny_model("bert"), 0.4, selection="random")
    with pytest.raises(ValueError, match="already reconfigured"):
        far.Primer(model)


def test_a_primed_model_can_be_freed_and_reconfigure_releases_the_snapshot():
    import gc
    import weakref

    from far.priming import primer_of

    model = tiny_model("bert")
    far.Primer(model)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # the Primer does not keep the model it watches alive

    model = tiny_model("bert").train()
    primer = far.Primer(model)
    _train_steps(model)
    far.reconfigure(model, 0.4)
    assert primer_of(model) is None
    snapshot = weakref.ref(primer)
    del primer
    gc.collect()
    assert snapshot() is None


def test_scores_travel_with_the_model_they_were_recorded_on():
    import copy

    first, second = tiny_model("bert").train(), tiny_model("bert").train()
    primer = far.Primer(first)
    _train_steps(first)
    far.Primer(second)  # a later Primer of another model does not replace the first model's
    with pytest.raises(ValueError, match="this Primer was created on another model"):
        far.reconfigure(second, retention=0.4, scores=primer)
    assert not far.is_reconfigured(second)
    clone = copy.deepcopy(first)  # the copy's Primer still watches the original: not picked up
    with pytest.raises(ValueError, match="never primed"):
        far.reconfigure(clone, retention=0.4)
    expected = far.select_learners(0.4, scores=primer.scores())
    far.reconfigure(first, far.FARConfig(retention=0.4), scores=primer)
    assert {k: v.tolist() for k, v in far.learners(first).items()} == {k: v.tolist() for k, v in expected.items()}
    assert far.get_config(first) == far.FARConfig(retention=0.4)


def test_a_config_or_its_fields_not_both():
    model = tiny_model("bert")
    with pytest.raises(TypeError, match="either a far.FARConfig or its fields"):
        far.reconfigure(model, far.FARConfig(0.4, "random"), seed=3)
    with pytest.raises(TypeError, match="retention is given twice"):
        far.reconfigure(model, 0.4, retention=0.5, selection="random")
    with pytest.raises(TypeError, match=r"unknown far.FARConfig field\(s\) \['retension'\]; the fields are retention"):
        far.reconfigure(model, retension=0.5, selection="random")
    with pytest.raises(TypeError, match="recompute_activations must be True or False"):
        far.reconfigure(model, 0.4, selection="random", recompute_activations="yes")
    assert not far.is_reconfigured(model)
    far.reconfigure(model, far.FARConfig(0.5, "random", seed=3))
    assert far.get_config(model) == far.FARConfig(retention=0.5, selection="random", seed=3)
