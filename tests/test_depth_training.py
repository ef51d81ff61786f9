"""Depth in whole runs: far.finetune freezes the bottom layers, with FAR's surgery or without it."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_examples, tiny_model

import far
from far.selection import AUTO_FREEZE_MASS

RUN = dict(optimizer="adamw", lr=1e-2, max_steps=5, batch_size=6, progress=False)


def deep(seed: int = 0, layers: int = 3) -> torch.nn.Module:
    return tiny_model("bert", seed=seed, num_hidden_layers=layers)


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model.eval()(**tiny_batch()).logits


@pytest.mark.parametrize("freeze_layers", [1, "auto"])
def test_a_depth_run_writes_a_file_for_the_stock_model(tmp_path, freeze_layers):
    # Six layers: under AdamW priming the layers move nearly alike, so `auto` freezes one (the bottom sixth holds
    # less than AUTO_FREEZE_MASS of the change); with three it would freeze none and check nothing below.
    model, stock = deep(layers=6), deep(layers=6)
    result = far.finetune(model, tiny_examples(), far.FARConfig(0.4, freeze_layers=freeze_layers), priming=2, **RUN)
    frozen, _, below = far.summary(model, verbose=False).frozen_layers
    if freeze_layers == "auto":
        # K from the change priming measured: the bottom K layers hold under AUTO_FREEZE_MASS of it.
        change = result.priming_layer_change
        assert len(change) == 6 and abs(sum(change) - 1) < 1e-3
        assert sum(change[:frozen]) < AUTO_FREEZE_MASS <= sum(change[: frozen + 1])
    assert frozen == 1 and below
    # Priming moved every weight; the frozen layer and the embeddings are the stock values again.
    stock_params = dict(stock.named_parameters())
    bottom = {
        n: p for n, p in model.named_parameters() if (".layer.0." in n or "embeddings" in n) and n in stock_params
    }
    assert any(".layer.0.attention" in n for n in bottom) and any("embeddings" in n for n in bottom)
    assert all(torch.equal(p, stock_params[n]) for n, p in bottom.items())
    above = {n: p for n, p in model.named_parameters() if ".layer.5.attention" in n and p.requires_grad}
    assert above and not all(torch.equal(p, stock_params[n]) for n, p in above.items())
    path = far.save_learners(model, tmp_path / "user.safetensors")
    far.load_learners(stock, path)
    assert torch.equal(logits(stock), logits(model))


def test_plain_freezing_of_the_bottom_layers_without_surgery():
    model, before = deep(), deep()
    far.finetune(model, tiny_examples(), None, freeze_layers=2, **RUN)
    assert not far.is_reconfigured(model)
    after, stock = dict(model.named_parameters()), dict(before.named_parameters())
    for name, p in after.items():
        bottom = "embeddings" in name or ".layer.0." in name or ".layer.1." in name
        assert torch.equal(p, stock[name]) == bottom, name


def test_freeze_layers_is_said_once():
    with pytest.raises(ValueError, match=r"set FARConfig\(freeze_layers=...\)"):
        far.finetune(deep(), tiny_examples(), far.FARConfig(0.4), freeze_layers=1, **RUN)
    with pytest.raises(ValueError, match="'auto' picks the depth from FAR's priming scores"):
        far.finetune(deep(), tiny_examples(), None, freeze_layers="auto", **RUN)


def test_auto_depth_with_random_selection_primes_for_the_scores():
    model = deep()
    result = far.finetune(model, tiny_examples(), far.FARConfig(0.4, "random", freeze_layers="auto"), priming=2, **RUN)
    assert result.priming_steps == 2 and far.get_config(model).freeze_layers == "auto"


def _trainable_while_priming(config: far.FARConfig, **options) -> dict[str, bool]:
    """requires_grad of every parameter as the first priming step's loss is computed."""
    model, seen = deep(), {}

    def loss_fn(model, batch):
        if not seen:
            seen.update({n: p.requires_grad for n, p in model.named_parameters()})
        return model(**batch).loss

    far.finetune(model, tiny_examples(), config, priming=2, loss_fn=loss_fn, **RUN, **options)
    return seen


def test_priming_leaves_alone_what_the_surgery_freezes_and_puts_back():
    # The embeddings and a fixed depth would go back to their stock values at the surgery: priming
    # does not train them (and backward stops at layer K from the first step).
    seen = _trainable_while_priming(far.FARConfig(0.4, freeze_embeddings=True, freeze_layers=1))
    for name, trainable in seen.items():
        bottom = "embeddings" in name or ".layer.0." in name
        assert trainable != bottom, name
    # With "auto" the depth is known only after priming; the embeddings still are frozen up front.
    seen = _trainable_while_priming(far.FARConfig(0.4, freeze_embeddings=True, freeze_layers="auto"))
    assert not seen["bert.embeddings.word_embeddings.weight"] and seen["bert.encoder.layer.0.output.dense.weight"]


@pytest.mark.parametrize("options", [dict(prime_frozen=True), dict(reset_frozen=False)])
def test_priming_trains_everything_when_asked_or_when_primed_values_are_kept(options):
    seen = _trainable_while_priming(far.FARConfig(0.4, freeze_embeddings=True, freeze_layers=1), **options)
    assert all(seen.values())


def test_prime_frozen_is_checked():
    with pytest.raises(TypeError, match="prime_frozen must be True, False or None"):
        far.finetune(deep(), tiny_examples(), far.FARConfig(0.4), prime_frozen="yes", **RUN)


def test_a_run_reports_each_layers_share_of_primings_change():
    result = far.finetune(deep(), tiny_examples(), far.FARConfig(0.4, freeze_layers="auto"), priming=2, **RUN)
    shares = result.priming_layer_change
    assert len(shares) == 3 and abs(sum(shares) - 1) < 1e-3 and all(s > 0 for s in shares)
    assert far.finetune(deep(), tiny_examples(), None, **RUN).priming_layer_change is None
