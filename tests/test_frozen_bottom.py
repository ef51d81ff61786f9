"""The frozen bottom computed once per example: the same training as without the cache, fewer bottom passes."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, assert_state, pad, ragged_examples, state, tiny_examples, tiny_model

import far
from far.encoder import LeanBertForSequenceClassification
from far.training.frozen_bottom import FrozenBottom
from far.training.losses import default_loss

NO_DROPOUT = {
    "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}
RUN = dict(optimizer="adamw", lr=1e-2, epochs=3, batch_size=4, progress=False)


def deep(**overrides) -> torch.nn.Module:
    return tiny_model("bert", **{"num_hidden_layers": 3, **NO_DROPOUT["bert"], **overrides})


def assert_same_training(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    """Every tensor of two trained models equal to rounding, but the attention key biases.

    A key bias shifts every score of a query alike, which softmax ignores: its gradient is rounding noise, and AdamW
    scales noise up to full-size steps.
    """
    want = expected.state_dict()
    assert got.state_dict().keys() == want.keys()
    for key, value in got.state_dict().items():
        if not key.endswith("key.bias"):
            torch.testing.assert_close(value, want[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture
def computed_rows(monkeypatch) -> list[int]:
    """Rows that went through the bottom layers, over every FrozenBottom of the test."""
    counted: list[int] = []
    compute = FrozenBottom._compute

    def counting(self, loss_fn, batch):
        counted.append(batch["input_ids"].shape[0])
        return compute(self, loss_fn, batch)

    monkeypatch.setattr(FrozenBottom, "_compute", counting)
    return counted


@pytest.mark.parametrize(
    "config, options, layers, frozen",
    [
        (None, dict(freeze_layers=2), 3, 2),
        (far.FARConfig(0.4, freeze_embeddings=True, freeze_layers=1), dict(priming=2), 3, 1),
        # Six layers, so that `auto` freezes one (with three it freezes none and there is no bottom to keep).
        (far.FARConfig(0.4, freeze_layers="auto"), dict(priming=2), 6, 1),
    ],
    ids=["plain-freezing", "far-depth", "far-auto"],
)
def test_a_cached_run_trains_as_an_uncached_one(config, options, layers, frozen, computed_rows):
    # Without dropout anywhere, the cache changes nothing but where the bottom's states come from.
    cached, plain = deep(num_hidden_layers=layers), deep(num_hidden_layers=layers)
    examples = ragged_examples()
    assert far.finetune(plain, examples, config, collate_fn=pad, **RUN, **options).frozen_cache_bytes == 0
    result = far.finetune(cached, examples, config, collate_fn=pad, cache_frozen=True, **RUN, **options)
    assert_same_training(cached, plain)
    assert far.summary(cached, verbose=False).frozen_layers[0] == frozen
    # 9 steps of 4 examples; the bottom saw each of the 12 examples once per phase (priming, then training).
    assert 0 < sum(computed_rows) <= 2 * len(examples) < 9 * 4
    tokens = sum(len(e["input_ids"]) for e in examples)
    assert result.frozen_cache_bytes == tokens * cached.config.hidden_size * 4  # every example, unpadded, fp32


def test_the_cached_bottom_runs_without_dropout_and_the_top_with_it():
    model = tiny_model("bert", num_hidden_layers=3)  # dropout 0.1 everywhere
    far.freeze_layers(model, 2)
    batch = pad(ragged_examples(4))
    frozen = FrozenBottom(model)
    model.train()
    with frozen.serving(default_loss, batch, keys=range(4)):
        torch.manual_seed(0)
        train_top = model(**batch).logits
    # The kept states are the eval-mode bottom's: with the top in eval mode too, the model's eval logits.
    model.eval()
    with frozen.serving(default_loss, batch, keys=range(4)):
        eval_cached = model(**batch).logits
    torch.testing.assert_close(eval_cached, model(**batch).logits)
    assert not torch.allclose(train_top, eval_cached)  # dropout above the bottom still draws


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "opt"])
def test_served_states_give_the_models_own_loss_and_gradients(arch):
    # Eval mode on both sides: the cached run's loss and every gradient equal the model's own.
    model = tiny_model(arch)
    far.freeze_layers(model, 1)
    batch = pad(ragged_examples(5, seed=3))
    if arch in ("roberta", "xlm-roberta"):  # position ids count from the pad token: keep real tokens off it
        batch["input_ids"] = batch["input_ids"].clamp(min=2) * batch["attention_mask"] + (1 - batch["attention_mask"])
    expected = default_loss(model, batch)
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    frozen = FrozenBottom(model)
    for _ in range(2):  # the first pass computes the rows, the second serves them
        with frozen.serving(default_loss, batch, keys=range(5)):
            loss = default_loss(model, batch)
        torch.testing.assert_close(loss, expected)
    loss.backward()
    for name, grad in grads.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, msg=name)
    assert frozen.computed_rows == 5 and frozen.bytes > 0


def test_the_lean_bert_runtime_is_served_too():
    torch.manual_seed(0)
    model = LeanBertForSequenceClassification(tiny_model("bert").config).eval()
    far.freeze_layers(model, 1)
    batch = pad(ragged_examples(5, seed=4))
    expected = default_loss(model, batch)
    frozen = FrozenBottom(model)
    for _ in range(2):
        with frozen.serving(default_loss, batch, keys=range(5)):
            torch.testing.assert_close(default_loss(model, batch), expected)
    assert frozen.computed_rows == 5


def test_mezo_with_the_cache_takes_the_same_steps():
    examples = ragged_examples()
    options = dict(optimizer="mezo", lr=1e-3, max_steps=6, batch_size=4, freeze_layers=1, collate_fn=pad)
    plain, cached = deep(), deep()
    far.finetune(plain, examples, None, progress=False, **options)
    far.finetune(cached, examples, None, progress=False, cache_frozen=True, **options)
    assert_same_training(cached, plain)


def test_a_full_cache_computes_again_and_gives_the_same_run(computed_rows):
    examples = ragged_examples()
    kept, none_kept = deep(), deep()
    far.finetune(kept, examples, None, freeze_layers=2, collate_fn=pad, cache_frozen=True, **RUN)
    kept_rows = sum(computed_rows)
    options = dict(freeze_layers=2, collate_fn=pad, cache_frozen=True)
    far.finetune(none_kept, examples, None, cache_frozen_mib=0, **options, **RUN)
    # Every row of every step, and of the first step's batch once more for the estimate before it (a kept
    # bottom serves the step those rows).
    assert sum(computed_rows) - kept_rows == 9 * 4 + 4 > kept_rows
    assert_same_training(none_kept, kept)


def test_cache_frozen_needs_a_frozen_bottom_and_refuses_before_touching_the_model():
    model = deep()
    before = state(model)
    cases = [
        (dict(config=None), "this run freezes none"),
        (dict(config=far.FARConfig(0.4)), "this run freezes none"),
        (dict(config=None, freeze_layers=0), "this run freezes none"),
        (dict(config=None, freeze_layers=3), "freezes every layer"),
        (dict(config=None, freeze_layers=1, memory_budget=4096), "does not plan for: use one of the two"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            far.finetune(model, tiny_examples(), cache_frozen=True, **RUN, **options)
        assert_state(model, before)
        assert all(p.requires_grad for p in model.parameters())


def test_frozen_bottom_errors_say_what_to_do():
    model = deep()
    with pytest.raises(ValueError, match=r"freeze them first \(far.freeze_layers\(model, K\)"):
        FrozenBottom(model)
    far.freeze_layers(model, 3)
    with pytest.raises(ValueError, match="no layer above the cached bottom trains"):
        FrozenBottom(model)

    model = far.freeze_layers(deep(), 1)
    frozen = FrozenBottom(model)
    batch = pad(ragged_examples(3))
    left = {**batch, "attention_mask": batch["attention_mask"].flip(1)}
    with pytest.raises(ValueError, match="padding_side = 'right'"):
        with frozen.serving(default_loss, left, keys=range(3)):
            pass
    with pytest.raises(ValueError, match="give one key per example"):
        with frozen.serving(default_loss, batch, keys=range(2)):
            pass
    model.bert.encoder.layer[0].output.dense.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="build a new one"):
        with frozen.serving(default_loss, batch, keys=range(3)):
            pass


def test_the_layers_are_put_back_after_serving():
    model = far.freeze_layers(deep(), 2)
    frozen = FrozenBottom(model)
    batch = pad(ragged_examples(3))
    with pytest.raises(KeyError):
        with frozen.serving(default_loss, batch, keys=range(3)):
            raise KeyError("inside the block")
    assert all("forward" not in layer.__dict__ for layer in model.bert.encoder.layer)
    with torch.no_grad():
        a = model(**batch).logits
        with frozen.serving(default_loss, batch, keys=range(3)):
            b = model(**batch).logits
    torch.testing.assert_close(a, b)
