"""far.MeZO: perturb/restore within rounding, sparse updates after FAR, the SPSA update, resume, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_batch, tiny_model
from torch import nn

import far
from far.seeds import derive_seed
from far.training.scratch import CHUNK, scratch_for


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: _bits(p) for n, p in model.named_parameters()}


def _assert_bit_identical(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    for n, p in model.named_parameters():
        assert torch.equal(_bits(p), before[n]), f"{n} changed"


# One float32 add is off by at most half an ulp of its result (<= 2**-24 of it); the three adds of a
# step (+εz, −2εz, +εz) each see values of at most |θ| + 2ε|z|, and their errors add up.
ROUNDING = 3 * 2.0**-24


def _assert_restored(model: nn.Module, before: dict[str, torch.Tensor], eps: float, steps: int = 1) -> None:
    """Every weight within the rounding of `steps` perturb/restore round trips (|z| < 7 here)."""
    for n, p in model.named_parameters():
        theta = before[n].view(torch.float32)
        bound = steps * ROUNDING * (theta.abs() + 2 * eps * 7) + 2.0**-140
        assert ((p.detach() - theta).abs() <= bound).all(), f"{n} moved by more than rounding"


def _awkward_model() -> nn.Module:
    """Weights of every magnitude (tiny ones lose bits when εz is added), ±0 and a tensor of several chunks."""
    torch.manual_seed(0)
    model = nn.Module()
    spread = torch.randn(3 * CHUNK + 1000) * torch.logspace(-9, 3, 3 * CHUNK + 1000)
    spread[:4] = torch.tensor([0.0, -0.0, 1.0, -(2.0**-126)])
    model.big = nn.Parameter(spread)
    model.small = nn.Parameter(torch.randn(5, 3) * 1e-4)
    return model


def test_perturb_and_restore_is_exact_up_to_rounding():
    model = _awkward_model()
    before = _snapshot(model)
    eps = 1e-3
    optimizer = far.MeZO(model.parameters(), lr=1e-3, eps=eps)
    params = optimizer._trainable()
    seed = derive_seed(0, 0, 0)
    optimizer._scratch = scratch_for([p for p, _ in params], {})
    theta = before["big"].view(torch.float32)
    z = torch.cat([z.clone() for i, _, z in optimizer._directions(params, seed) if i == 0])
    with torch.no_grad():
        optimizer._add(params, seed, eps)
        assert torch.equal(model.big.detach(), torch.add(theta, z, alpha=eps))  # it perturbs along z
        optimizer._add(params, seed, -2 * eps)
        optimizer._add(params, seed, eps)
    drift = (model.big.detach() - theta).abs()
    assert (drift <= ROUNDING * (theta.abs() + 2 * eps * z.abs()) + 2.0**-140).all()
    assert drift.max() > 0  # the round trip is not exact everywhere: the bound is what holds
    _assert_restored(model, before, eps)


def test_drift_of_many_steps_is_a_rounding_walk():
    """With a flat loss (g = 0) a step is only the round trip: after 200 steps every weight is within
    200 steps' rounding, and the rms drift is far below one ulp per step (the errors do not add up
    in one direction)."""
    torch.manual_seed(1)
    weight = nn.Parameter(torch.randn(20_000) * 0.05)
    before = weight.detach().clone()
    eps, steps = 1e-3, 200
    optimizer = far.MeZO([weight], lr=1e-3, eps=eps)
    for _ in range(steps):
        optimizer.step(lambda: 1.0)
    drift = weight.detach() - before
    assert (drift.abs() <= steps * ROUNDING * (before.abs() + 2 * eps * 7)).all()
    ulp = before.abs() * 2.0**-23
    assert drift.pow(2).mean().sqrt() < 0.2 * steps * ulp.pow(2).mean().sqrt()


def test_half_precision_trainable_tensors_are_refused_before_anything_moves():
    model = nn.Linear(4, 3).to(torch.bfloat16)
    before = _snapshot(model)
    optimizer = far.MeZO(model.parameters())
    with pytest.raises(ValueError, match="keep trainable tensors in float32"):
        optimizer.step(lambda: 0.0)
    _assert_bit_identical(model, before)
    assert optimizer.steps_taken == 0
    model.requires_grad_(False)
    model.bias.requires_grad_(True)
    model.bias.data = model.bias.data.float()  # frozen bf16 tensors are fine
    optimizer.step(lambda: 0.0)
    assert torch.equal(_bits(model.weight), before["weight"])


def test_closure_sees_plus_then_minus_perturbation_and_weights_come_back():
    model = _awkward_model()
    before = _snapshot(model)
    seen = []

    def closure():
        assert not torch.is_grad_enabled()
        seen.append(model.small.detach().clone())
        return float("nan") if len(seen) == 2 else 1.0  # a NaN at θ − εz: the step is skipped

    optimizer = far.MeZO(model.parameters(), lr=1e-3, eps=1e-3)
    with pytest.warns(RuntimeWarning, match="skipped and the weights are left as they were"):
        loss = optimizer.step(closure)
    assert math.isnan(loss) and len(seen) == 2
    theta = before["small"].view(torch.float32)
    plus, minus = seen[0] - theta, seen[1] - theta
    assert torch.allclose(plus, -minus, atol=1e-9) and plus.abs().max() > 1e-5
    _assert_restored(model, before, 1e-3)
    assert optimizer.steps_taken == 1 and optimizer.steps_skipped == 1


def test_nan_at_plus_skips_without_the_minus_pass():
    model = _awkward_model()
    before = _snapshot(model)
    calls = []
    optimizer = far.MeZO(model.parameters(), lr=1.0)
    with pytest.warns(RuntimeWarning, match="the loss is inf"):
        optimizer.step(lambda: calls.append(1) or float("inf"))
    assert len(calls) == 1
    _assert_restored(model, before, 1e-3)


def test_closure_that_raises_leaves_weights_exact():
    model = _awkward_model()
    before = _snapshot(model)
    optimizer = far.MeZO(model.parameters())

    def closure():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        optimizer.step(closure)
    _assert_restored(model, before, 1e-3)


def test_update_is_theta_minus_lr_g_z_with_directions_averaged():
    w0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    target = torch.randn(4, 3, generator=torch.Generator().manual_seed(4))
    param = nn.Parameter(w0.clone())
    lr, eps, seed = 0.1, 1e-3, 7
    optimizer = far.MeZO([param], lr=lr, eps=eps, n_directions=2, seed=seed)
    loss = lambda: ((param - target) ** 2).sum()  # noqa: E731
    optimizer.step(loss)
    expected = w0.clone()
    for k in range(2):
        z = torch.empty(4, 3).normal_(generator=torch.Generator().manual_seed(derive_seed(seed, 0, k)))
        g = (((w0 + eps * z - target) ** 2).sum() - ((w0 - eps * z - target) ** 2).sum()) / (2 * eps)
        expected -= lr * g * z / 2
    # The loss (~20) is resolved to an ulp (2e-6), so g only to 2e-6 / 2ε = 1e-3: the second direction
    # is evaluated at θ restored up to rounding, not bit for bit, and its g may differ by that much.
    assert torch.allclose(param.detach(), expected, atol=3e-4)
    assert not torch.allclose(param.detach(), w0, atol=0.1)


def test_weight_decay_skips_1d_tensors():
    layer = nn.Linear(4, 3)
    w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
    optimizer = far.MeZO(layer.parameters(), lr=0.1, weight_decay=0.5)
    optimizer.step(lambda: 1.0)  # a flat loss: g = 0, only the decay moves the weights (and rounding)
    assert torch.allclose(layer.weight.detach(), w * (1 - 0.1 * 0.5), rtol=1e-6, atol=1e-8)
    assert torch.allclose(layer.bias.detach(), b, rtol=1e-6, atol=1e-8)
    assert not torch.allclose(layer.weight.detach(), w, rtol=1e-3)


@pytest.mark.slow
def test_sparse_mezo_after_far_leaves_frozen_weights_bit_identical():
    model = far.reconfigure(tiny_model("bert"), retention=0.3, selection="random")
    before = _snapshot(model)
    batch = tiny_batch()
    labels = torch.tensor([0, 1, 2])
    optimizer = far.MeZO(model.parameters(), lr=1e-2, eps=1e-3)  # frozen tensors handed in too: skipped
    for _ in range(25):
        optimizer.step(lambda: model(**batch, labels=labels).loss)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert not torch.equal(_bits(p), before[name]), f"trainable {name} did not move"
        else:
            assert torch.equal(_bits(p), before[name]), f"frozen {name} moved"
        assert p.grad is None
    assert any(not p.requires_grad for p in model.parameters())


def test_loss_falls_on_a_learnable_task():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = far.MeZO(model.parameters(), lr=0.02, eps=1e-3, n_directions=4)
    losses = [optimizer.step(lambda: nn.functional.mse_loss(model(x), y)) for _ in range(300)]
    assert sum(losses[-20:]) / 20 < 0.1 * sum(losses[:20]) / 20


@pytest.mark.slow
def test_state_dict_resumes_exactly():
    batch, labels = tiny_batch(), torch.tensor([0, 1, 2])

    def run(model, optimizer, steps):
        for _ in range(steps):
            optimizer.step(lambda: model(**batch, labels=labels).loss)

    model = tiny_model("bert")
    optimizer = far.MeZO(model.parameters(), lr=1e-2, seed=5, weight_decay=0.01)
    run(model, optimizer, 6)

    first = tiny_model("bert")
    first_opt = far.MeZO(first.parameters(), lr=1e-2, seed=5, weight_decay=0.01)
    run(first, first_opt, 3)
    state, weights = first_opt.state_dict(), {k: v.clone() for k, v in first.state_dict().items()}
    second = tiny_model("bert", seed=9)
    second.load_state_dict(weights)
    second_opt = far.MeZO(second.parameters(), lr=1.0, seed=0, weight_decay=0.01)
    second_opt.load_state_dict(state)
    assert second_opt.param_groups[0]["lr"] == 1e-2 and second_opt.seed == 5 and second_opt.steps_taken == 3
    run(second, second_opt, 3)
    for (n, a), b in zip(model.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_global_rng_is_untouched():
    model = nn.Linear(3, 2)
    state = torch.get_rng_state()
    far.MeZO(model.parameters(), lr=0.1).step(lambda: model(torch.ones(1, 3)).sum())
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(lr=0.0), ValueError, "lr must be finite and > 0"),
        (dict(lr=-1e-6), ValueError, "lr must be finite and > 0"),
        (dict(eps=0.0), ValueError, "eps must be finite and > 0"),
        (dict(eps=float("nan")), TypeError, "eps must be a number"),
        (dict(weight_decay=-0.1), ValueError, "weight_decay must be finite and >= 0"),
        (dict(n_directions=0), ValueError, "n_directions must be an int >= 1"),
        (dict(seed=1.5), TypeError, "seed must be an int"),
    ],
)
def test_bad_hyperparameters_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        far.MeZO(nn.Linear(2, 2).parameters(), **kwargs)


def test_bad_use_is_refused_clearly():
    layer = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="needs a closure"):
        far.MeZO(layer.parameters()).step()
    with pytest.raises(ValueError, match="share one eps"):
        far.MeZO([{"params": [layer.weight], "eps": 1e-3}, {"params": [layer.bias], "eps": 1e-2}]).step(lambda: 0.0)
    with pytest.raises(ValueError, match="lr must be finite"):
        far.MeZO([{"params": [layer.weight], "lr": -1.0}])
    with pytest.raises(ValueError, match="scalar loss"):
        far.MeZO(layer.parameters()).step(lambda: torch.ones(2))
    layer.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter with requires_grad=True"):
        far.MeZO(layer.parameters()).step(lambda: 0.0)
    with pytest.raises(ValueError, match="not a MeZO state dict"):
        far.MeZO(nn.Linear(2, 2).parameters()).load_state_dict(
            torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1).state_dict()
        )
