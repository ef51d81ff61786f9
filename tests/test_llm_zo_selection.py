"""Selections for zeroth-order training on the lean runtime: depth with a cached frozen bottom, LeZO, magnitude."""

from __future__ import annotations

import pytest
import torch
from test_llm_lean import right_padded, tiny_hf

from far.config import FARConfig
from far.data.prompts import prompt_loss_fn
from far.llm.compact import CompactWeight
from far.llm.lean_config import from_hf_config
from far.llm.lean_far import ZO_RETENTION, magnitude_scores, prime_and_split, set_trainable, zeroth_order_depth
from far.llm.lean_model import from_state_dict
from far.llm.prefix import PrefixCache
from far.llm.zo import CompactMeZO
from far.recipes.settings import RunSettings

LABEL_IDS = torch.tensor([5, 11])


def lean(model_type: str = "gemma3", layers: int = 3):
    hf = tiny_hf(model_type) if model_type == "llama" else tiny_hf(model_type, num_hidden_layers=layers)
    return from_state_dict(from_hf_config(hf.config), hf.state_dict())


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    ids, mask = right_padded(seed)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}


def layer_weights(model, i: int) -> list[CompactWeight]:
    return [w for w in model.layers[i].modules() if isinstance(w, CompactWeight)]


def test_frozen_layers_freeze_everything_below_and_far_with_depth_does_it_from_the_scores():
    model = lean()
    set_trainable(model, "all", frozen_layers=1)
    assert model.lowest_trainable_layer() == 1
    assert not any(w.trainable for w in layer_weights(model, 0)) and all(w.trainable for w in layer_weights(model, 1))
    with pytest.raises(ValueError, match="one layer left to train"):
        set_trainable(model, "all", frozen_layers=3)
    model = lean()
    prime_and_split(model, [batch()], prompt_loss_fn(LABEL_IDS), FARConfig(0.2, freeze_layers=2))
    assert model.lowest_trainable_layer() == 2
    assert model.layers[0].mlp.learner_nodes.numel() == 0 and model.layers[2].mlp.learner_nodes.numel() > 0


def test_the_cached_bottom_gives_the_plain_loss_bit_for_bit_and_is_computed_once():
    model = lean()
    set_trainable(model, "all", frozen_layers=2)
    cache = PrefixCache(model)
    cached, plain = cache.loss_fn(LABEL_IDS), prompt_loss_fn(LABEL_IDS)
    with torch.no_grad():
        for seed in (1, 2, 1):  # the third batch holds the first's rows: nothing to compute
            b = batch(seed)
            assert torch.equal(cached(model, b), plain(model, b))  # the same products in the same order
    assert cache.computed_rows == 6
    optimizer = CompactMeZO(model, lr=1e-2, eps=1e-3, seed=3)
    twin = lean()
    set_trainable(twin, "all", frozen_layers=2)
    twin_optimizer = CompactMeZO(twin, lr=1e-2, eps=1e-3, seed=3)
    b = batch()
    optimizer.step(lambda: cached(model, b))
    twin_optimizer.step(lambda: plain(twin, b))
    for a, c in zip(model.compact_weights(), twin.compact_weights(), strict=True):
        assert torch.equal(a.stored, c.stored)


def test_a_cache_refuses_trainable_layers_under_it_and_a_full_cache_still_works():
    model = lean()
    set_trainable(model, "all", frozen_layers=1)
    with pytest.raises(ValueError, match="layer 1 holds a trainable weight"):
        PrefixCache(model, n_layers=2)
    cache = PrefixCache(model, max_bytes=0)  # keeps nothing, computes every time
    loss = cache.loss_fn(LABEL_IDS)
    with torch.no_grad():
        loss(model, batch())
        loss(model, batch())
    assert cache.bytes == 0 and cache.computed_rows == 6
    set_trainable(model, "all")
    with pytest.raises(RuntimeError, match="became trainable after the PrefixCache was built"):
        cache.hidden(batch()["input_ids"], batch()["attention_mask"])


def test_layer_sparse_steps_move_only_the_drawn_layers_and_replay():
    model = lean("llama")
    set_trainable(model, "all")
    optimizer = CompactMeZO(model, lr=1e-2, eps=1e-3, seed=5, layer_fraction=0.5)
    active = optimizer.active_weights(0)
    assert active == optimizer.active_weights(0) and active is not None
    drawn = [i for i in range(len(model.layers)) if all(w.index in active for w in layer_weights(model, i))]
    assert len(drawn) == round(0.5 * len(model.layers))
    before = {w.index: w.stored.clone() for w in model.compact_weights()}
    b = batch()
    optimizer.step(lambda: prompt_loss_fn(LABEL_IDS)(model, b))
    for w in model.compact_weights():
        assert torch.equal(w.stored, before[w.index]) == (w.index not in active), w.index
    with pytest.raises(ValueError, match="layer_fraction must be in"):
        CompactMeZO(model, lr=1e-2, layer_fraction=0.0)


def test_magnitude_scores_rank_the_smallest_nodes_first():
    model = lean()
    scores = magnitude_scores(model)
    mlp = model.layers[0].mlp
    mean_abs = sum(
        getattr(mlp, p).parts[0].stored.float().abs().mean(dim=1 - (1 if p == "down_proj" else 0))
        for p in ("gate_proj", "up_proj", "down_proj")
    )
    torch.testing.assert_close(scores["layers.0.mlp.down_proj"], -mean_abs)
    prime_and_split(model, [], prompt_loss_fn(LABEL_IDS), FARConfig(0.25), scoring="magnitude")
    chosen = set(model.layers[0].mlp.learner_nodes.tolist())
    assert chosen == set(mean_abs.argsort()[:10].tolist())
    with pytest.raises(ValueError, match="scoring must be one of gradient, magnitude"):
        prime_and_split(lean(), [], prompt_loss_fn(LABEL_IDS), FARConfig(0.25), scoring="random")


def test_the_default_zeroth_order_depth_leaves_the_top_third():
    assert [zeroth_order_depth(n) for n in (30, 18, 3, 2)] == [20, 12, 2, 1]


def test_a_causal_lms_far_default_is_decided_in_one_place():
    def far_of(**given) -> FARConfig | None:
        return RunSettings(model="smollm2-135m", optimizer="mezo", **given).lean_layout(30, torch.bfloat16).far

    default = far_of()
    assert (default.freeze_layers, default.retention) == (20, ZO_RETENTION)
    assert (far_of(retention=0.3).freeze_layers, far_of(retention=0.3).retention) == (20, 0.3)
    told = far_of(freeze_layers=2)  # a depth given: the encoder's retention default, as the settings built it
    assert (told.freeze_layers, told.retention) == (2, RunSettings().far.retention)
    assert far_of(method="full") is None
