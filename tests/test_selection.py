from __future__ import annotations

import pytest
import torch

from far.selection import learner_count, select_learners


def test_per_layer_takes_the_top_k_of_each_ffn():
    scores = {"a": torch.tensor([0.1, 0.9, 0.5, 0.2, 0.7]), "b": torch.tensor([3.0, 1.0, 2.0, 0.0, 5.0])}
    chosen = select_learners(0.4, scores=scores)
    assert chosen["a"].tolist() == [1, 4] and chosen["b"].tolist() == [0, 4]
    assert all(v.dtype == torch.int64 for v in chosen.values())


def test_learner_count_rounds_and_keeps_at_least_one():
    assert learner_count(1536, 0.4) == 614
    assert learner_count(10, 0.01) == 1
    assert learner_count(10, 1.0) == 10
    assert learner_count(5, 0.5) == 2  # round half to even, as Python's round


def test_ties_go_to_the_lower_index_deterministically():
    scores = {"a": torch.zeros(6)}
    assert select_learners(0.5, scores=scores)["a"].tolist() == [0, 1, 2]
    scores = {"a": torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0])}
    assert select_learners(0.4, scores=scores)["a"].tolist() == [1, 2]


def test_global_takes_the_top_nodes_across_ffns_with_one_per_ffn():
    scores = {
        "a": torch.tensor([9.0, 8.0, 7.0, 6.0]),
        "b": torch.tensor([0.1, 0.3, 0.2, 0.0]),
        "c": torch.tensor([5.0, 4.0, 0.0, 0.0]),
    }
    chosen = select_learners(0.5, scores=scores, selection="global")  # budget round(0.5*12) = 6
    assert chosen["b"].tolist() == [1]  # its best node, though below every other chosen score
    assert chosen["a"].tolist() == [0, 1, 2, 3] and chosen["c"].tolist() == [0]
    assert sum(v.numel() for v in chosen.values()) == 6


def test_global_matches_its_definition_on_random_scores():
    generator = torch.Generator().manual_seed(0)
    scores = {
        name: torch.rand(n, generator=generator) * s
        for name, n, s in [("a", 50, 1.0), ("b", 30, 10.0), ("c", 20, 0.01)]
    }
    chosen = select_learners(0.3, scores=scores, selection="global")
    assert sum(v.numel() for v in chosen.values()) == round(0.3 * 100)
    assert all(v.numel() >= 1 for v in chosen.values())
    # apart from each FFN's guaranteed best node, every chosen score beats every unchosen one
    guaranteed = {(n, int(s.argmax())) for n, s in scores.items()}
    picked = [(float(scores[n][i]), (n, int(i))) for n, v in chosen.items() for i in v if (n, int(i)) not in guaranteed]
    left = [float(s[i]) for n, s in scores.items() for i in range(s.numel()) if i not in chosen[n].tolist()]
    assert min(p for p, _ in picked) >= max(left)


def test_random_is_reproducible_from_its_seed_and_needs_no_scores():
    sizes = {"a": 100, "b": 60}
    first = select_learners(0.4, n_nodes=sizes, selection="random", seed=7)
    again = select_learners(0.4, n_nodes=sizes, selection="random", seed=7)
    other = select_learners(0.4, n_nodes=sizes, selection="random", seed=8)
    assert all(torch.equal(first[k], again[k]) for k in sizes)
    assert not torch.equal(first["a"], other["a"])
    assert [v.numel() for v in first.values()] == [40, 24]
    assert all(bool((v[1:] > v[:-1]).all()) for v in first.values())  # sorted, distinct


def test_random_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    select_learners(0.4, n_nodes={"a": 10}, selection="random", seed=0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(retention=0.0, scores={"a": torch.ones(3)}), "retention must be in"),
        (dict(retention=0.4), "needs priming scores"),
        (dict(retention=0.4, selection="random"), "needs n_nodes"),
        (dict(retention=0.4, scores={"a": torch.ones(3)}, selection="top"), "selection must be one of"),
    ],
)
def test_bad_selection_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_learners(**kwargs)
