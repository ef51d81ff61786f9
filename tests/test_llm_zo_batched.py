"""The batched one-sided zeroth-order step against a hand computation on the transformers twin of a tiny model."""

from __future__ import annotations

import pytest
import torch
from test_lm_train import chunks, hf_name, lean_and_hf

from far.llm.lean_far import set_trainable
from far.llm.prefix import PrefixCache
from far.llm.text_steps import TextSteps
from far.llm.zo_batched import CompactBatchedZO


def trained(model) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules() if getattr(m, "trainable", False)}


def test_a_batched_step_is_the_mean_of_one_sided_differences_on_the_transformers_model():
    lean, hf = lean_and_hf("llama")
    set_trainable(lean, "all", torch.float32, frozen_layers=1)
    ids = chunks()
    bottom = PrefixCache(lean).hidden(ids, torch.ones_like(ids))
    lr, eps, n = 1e-2, 1e-3, 3
    optimizer = CompactBatchedZO(lean, lr, eps, directions=n, seed=5)
    seeds = [optimizer.direction_seed(0, i) for i in range(n)]
    weights = trained(lean)
    directions = [
        {hf_name(name): lean.perturbation.direction(seed, m.index, m.stored.shape) for name, m in weights.items()}
        for seed in seeds
    ]
    params = dict(hf.named_parameters())

    def loss_at(direction: dict[str, torch.Tensor], scale: float) -> float:
        with torch.no_grad():
            for name, z in direction.items():
                params[name].add_(z, alpha=scale)
            loss = float(hf(input_ids=ids, labels=ids).loss)
            for name, z in direction.items():
                params[name].sub_(z, alpha=scale)
            return loss

    loss0 = loss_at(directions[0], 0.0)
    assert optimizer.step(lambda: lean.next_token_loss(ids, start=bottom, start_layer=1)) == pytest.approx(
        loss0, rel=1e-5
    )
    expected_grads = [(loss_at(z, eps) - loss0) / eps for z in directions]
    # One-sided differences of losses ~1e-3 apart: fp32 rounding moves each g by ~1e-4 of itself.
    assert optimizer.last_projected_grads == pytest.approx(expected_grads, rel=1e-3, abs=1e-4)
    for name, m in weights.items():
        hf_weight = params[hf_name(name)].detach()
        step = sum(g * z[hf_name(name)] for g, z in zip(optimizer.last_projected_grads, directions, strict=True))
        torch.testing.assert_close(m.stored, hf_weight - lr * step / n, rtol=1e-5, atol=1e-6)


def test_the_weights_are_read_perturbed_but_never_written_until_the_update():
    lean, _ = lean_and_hf("llama")
    set_trainable(lean, "all", torch.float32, frozen_layers=1)
    before = {n: m.stored.clone() for n, m in trained(lean).items()}
    seen = []

    def closure() -> float:
        seen.append({n: m.stored.clone() for n, m in trained(lean).items()})
        return float(lean.next_token_loss(chunks()))

    optimizer = CompactBatchedZO(lean, 1e-2, 1e-3, directions=2)
    optimizer.step(closure)
    assert len(seen) == 3  # one unperturbed pass and one per direction
    for stored in seen:
        for name, value in stored.items():
            assert torch.equal(value, before[name])
    assert lean.perturbation.scale == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, "lr must be a finite number > 0"),
        ({"eps": float("nan")}, "eps must be a finite number > 0"),
        ({"directions": 0}, "directions must be an integer >= 1"),
    ],
)
def test_bad_settings_are_refused_before_anything_changes(kwargs, message):
    lean, _ = lean_and_hf("llama")
    set_trainable(lean, "all", torch.float32, frozen_layers=1)
    before = [w.stored.clone() for w in lean.trainable_weights()]
    with pytest.raises(ValueError, match=message):
        CompactBatchedZO(lean, **{"lr": 1e-2, **kwargs})
    assert all(torch.equal(a, w.stored) for a, w in zip(before, lean.trainable_weights(), strict=True))


def test_text_steps_run_the_batched_estimator_and_split_micro_batches_alike():
    models = [lean_and_hf("llama")[0] for _ in range(2)]
    for model in models:
        set_trainable(model, "all", torch.float32, frozen_layers=1)
    ids = chunks(n=4)
    whole, split = (TextSteps(m, "zo-batched", 1e-2, PrefixCache(m), seed=3, directions=2) for m in models)
    assert whole([ids]) == pytest.approx(split([ids[:1], ids[1:]]), rel=1e-5)
    assert whole.state() == {"steps_taken": 1, "steps_skipped": 0}
    # Summed in another order, each loss moves by ~1e-7; divided by eps (1e-3) that is ~1e-4 of g per direction.
    for a, b in zip(models[0].trainable_weights(), models[1].trainable_weights(), strict=True):
        torch.testing.assert_close(a.stored, b.stored, rtol=1e-4, atol=5e-5)
