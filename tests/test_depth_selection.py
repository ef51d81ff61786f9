"""Depth-aware selection and the freeze_layers field: pure functions on hand-made scores."""

from __future__ import annotations

import pytest
import torch

import far
from far.selection import AUTO_FREEZE_MASS, auto_freeze_layers, select_depth, select_learners


def _scores(n_layers: int = 4, n: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}.ffn": torch.rand(n, generator=generator) for i in range(n_layers)}


@pytest.mark.parametrize("selection", ["per_layer", "global", "random"])
def test_frozen_layers_get_no_learners_and_the_budget_moves_up(selection):
    scores = _scores()
    chosen = select_learners(0.25, scores=scores, selection=selection, freeze_layers=2)
    counts = [v.numel() for v in chosen.values()]
    assert counts[:2] == [0, 0] and all(c >= 1 for c in counts[2:])
    assert sum(counts) == round(0.25 * 40)  # freezing two layers does not shrink the learner count
    assert all(v.dtype == torch.int64 and bool((v[1:] > v[:-1]).all()) for v in chosen.values())
    if selection != "global":
        assert counts[2:] == [5, 5]  # equal shares of the budget


def test_global_spends_the_budget_by_score_over_the_trainable_layers_only():
    scores = {
        "l0": torch.tensor([9.0, 9.0, 9.0, 9.0]),  # frozen: its high scores must not count
        "l1": torch.tensor([0.1, 0.3, 0.2, 0.0]),
        "l2": torch.tensor([5.0, 4.0, 3.0, 0.0]),
    }
    chosen = select_learners(0.5, scores=scores, selection="global", freeze_layers=1)  # budget 6 of 12
    assert chosen["l0"].tolist() == []
    # each trainable FFN's best node, then the 4 best of the rest: l2's 4.0 and 3.0, l1's 0.2 and 0.1
    assert chosen["l2"].tolist() == [0, 1, 2]
    assert chosen["l1"].tolist() == [0, 1, 2]
    assert sum(v.numel() for v in chosen.values()) == 6


def test_per_layer_takes_the_top_of_each_trainable_layer():
    scores = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.1, 0.9, 0.5, 0.2]), "c": torch.tensor([3.0, 1.0])}
    chosen = select_learners(0.5, scores=scores, freeze_layers=1)  # budget 4 over 6 trainable nodes
    assert list(chosen) == ["a", "b", "c"] and chosen["a"].numel() == 0
    assert [chosen["b"].numel(), chosen["c"].numel()] == [3, 1]  # shares in proportion to size: 4 * 4/6, 4 * 2/6
    assert chosen["b"].tolist() == [1, 2, 3] and chosen["c"].tolist() == [0]


def test_budget_shrinks_only_where_the_trainable_layers_are_full():
    chosen = select_learners(0.8, scores=_scores(), freeze_layers=2)  # 32 wanted, 20 nodes left
    assert [v.numel() for v in chosen.values()] == [0, 0, 10, 10]


def test_freeze_layers_zero_is_the_budget_over_all_layers():
    chosen = select_learners(0.25, scores=_scores(), freeze_layers=0)
    assert [v.numel() for v in chosen.values()] == [3, 3, 2, 2]  # 10 in shares; ties: the earlier layer
    assert sum(v.numel() for v in chosen.values()) == 10


def test_random_with_freeze_layers_is_reproducible_and_leaves_the_global_rng_alone():
    sizes = {f"l{i}": 20 for i in range(4)}
    torch.manual_seed(1)
    expected = torch.rand(2)
    torch.manual_seed(1)
    first = select_learners(0.3, n_nodes=sizes, selection="random", seed=4, freeze_layers=1)
    assert torch.equal(torch.rand(2), expected)
    again = select_learners(0.3, n_nodes=sizes, selection="random", seed=4, freeze_layers=1)
    assert all(torch.equal(first[k], again[k]) for k in sizes)
    assert [v.numel() for v in first.values()] == [0, 8, 8, 8]


def test_layer_of_groups_several_names_into_one_layer():
    scores = {"ffn0": torch.ones(4), "att0": torch.ones(2), "ffn1": torch.ones(4), "att1": torch.ones(2)}
    layers = {"ffn0": 0, "att0": 0, "ffn1": 1, "att1": 1}
    chosen = select_learners(0.5, scores=scores, freeze_layers=1, layer_of=layers)
    assert chosen["ffn0"].numel() == chosen["att0"].numel() == 0
    assert chosen["ffn1"].numel() + chosen["att1"].numel() == 6


# ---- the auto rule ----


def test_auto_freezes_the_bottom_layers_that_moved_little():
    scores = {"l0": torch.full((10,), 0.1), "l1": torch.full((10,), 0.1), "l2": torch.ones(10), "l3": torch.ones(10)}
    assert AUTO_FREEZE_MASS == 0.25
    assert auto_freeze_layers(scores) == 2  # 0.2 < 0.25 * 2.2 = 0.55, but 1.2 is not
    scores["l0"] = scores["l1"] = torch.ones(10)
    assert auto_freeze_layers(scores) == 0  # 1 is not < 0.25 * 4
    scores["l0"], scores["l1"] = torch.full((10,), 0.5), torch.full((10,), 0.2)
    assert auto_freeze_layers(scores) == 1  # 0.5 < 0.25 * 2.7 = 0.675, but 0.7 is not


def test_auto_on_evenly_moving_layers_freezes_under_a_quarter():
    for n_layers, expected in [(12, 2), (6, 1), (4, 0), (10, 2), (2, 0)]:
        scores = {f"l{i}": torch.ones(8) for i in range(n_layers)}
        assert auto_freeze_layers(scores) == expected, n_layers


def test_auto_normalises_per_node():
    # layer 0 is ten times wider: its sum equals each other layer's, its mean node is ten times smaller
    scores = {"l0": torch.full((100,), 0.01), **{f"l{i}": torch.full((10,), 0.1) for i in (1, 2, 3)}}
    assert auto_freeze_layers(scores) == 1  # by sums, layer 0 would weigh as each other layer: none frozen


def test_auto_keeps_one_layer_trainable_and_zero_scores_freeze_nothing():
    scores = {"l0": torch.zeros(4), "l1": torch.zeros(4), "l2": torch.ones(4)}
    assert auto_freeze_layers(scores) == 2
    assert auto_freeze_layers({"l0": torch.zeros(4), "l1": torch.zeros(4)}) == 0


def test_auto_through_select_learners():
    scores = {"l0": torch.full((10,), 0.1), "l1": torch.full((10,), 0.1), "l2": torch.ones(10), "l3": torch.ones(10)}
    chosen = select_learners(0.25, scores=scores, freeze_layers="auto")
    assert [v.numel() for v in chosen.values()] == [0, 0, 5, 5]  # two layers frozen, their budget moved up


# ---- bad input ----


@pytest.mark.parametrize(
    "value,error,message",
    [
        (True, TypeError, "freeze_layers must be None, an int >= 0 or 'auto'"),
        (1.5, TypeError, "freeze_layers must be None, an int >= 0 or 'auto'"),
        (-1, ValueError, "freeze_layers must be >= 0"),
        ("all", ValueError, "e.g. freeze_layers=2 freezes the bottom two layers"),
        ("AUTO", ValueError, "got the string 'AUTO'"),
    ],
)
def test_bad_freeze_layers_is_refused_by_the_config(value, error, message):
    with pytest.raises(error, match=message):
        far.FARConfig(freeze_layers=value)


def test_good_freeze_layers_values():
    assert far.FARConfig().freeze_layers is None
    assert far.FARConfig(freeze_layers="auto").freeze_layers == "auto"
    value = far.FARConfig(freeze_layers=torch.tensor(2).item()).freeze_layers
    assert value == 2 and type(value) is int


def test_freezing_every_layer_is_refused():
    with pytest.raises(ValueError, match="at most 3 leaves one to train"):
        select_depth(far.FARConfig(freeze_layers=4), n_nodes={f"l{i}": 4 for i in range(4)}, scores=_scores(4, 4))


def test_auto_without_scores_is_refused():
    with pytest.raises(ValueError, match="freeze_layers='auto' needs priming scores"):
        select_learners(0.4, n_nodes={"a": 4, "b": 4}, selection="random", freeze_layers="auto")
