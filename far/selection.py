"""Selection: from node scores and a retention fraction to the learner nodes of every FFN.

Pure functions. Ties go to the lower node index (and, for "global", the earlier FFN), so a selection
never depends on sort internals. With `freeze_layers`, the bottom K layers' groups get no learners
and the budget all groups would hold is spent over the others (`select_depth`); with
`retention="auto"` each group's count comes from its own scores, so nothing moves up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from far.config import AUTO, UNSET, FARConfig, as_config

# freeze_layers="auto" freezes the largest bottom stack of layers that together moved less than this
# fraction of all the change priming measured (each layer's change: the mean score of its nodes). Layers
# moving alike, that is just under a quarter of them (2 of 12, 1 of 6, none of 4): the deepest cut within
# a point of full fine-tuning on held-out training data (SST-2, 3 seeds; docs/results.md, "Depth from
# priming, chosen on held-out data").
AUTO_FREEZE_MASS = 0.25

# retention="auto" keeps, in each FFN, the fewest top-scoring nodes that together hold this share of the
# FFN's total priming score, within AUTO_RETENTION_BOUNDS: where the change is concentrated in a few
# nodes few learners suffice, where it is spread more are kept. The share was chosen on a part of the
# training data held out from training (docs/results.md, "Retention from priming"), never on a dev set.
AUTO_RETAIN_MASS = 0.5
# At least a twentieth of a layer's nodes learn (a layer whose scores are all in one node still adapts),
# and at most three fifths (beyond that FAR saves little over full fine-tuning).
AUTO_RETENTION_BOUNDS = (0.05, 0.6)


def needs_scores(config: FARConfig) -> bool:
    """Whether selecting with `config` reads priming's scores: every selection but "random" ranks nodes by them, and
    `freeze_layers="auto"` picks the depth from them. The one rule that the planner, the Trainer callback and the
    surgery read.

    Example:
        >>> needs_scores(FARConfig(0.4)), needs_scores(FARConfig(0.4, selection="random"))
        (True, False)
    """
    return config.selection != "random" or config.freeze_layers == AUTO


def learner_count(n_nodes: int, retention: float) -> int:
    """Learners kept in an FFN of `n_nodes` nodes: round(retention * n), at least 1."""
    return min(n_nodes, max(1, round(retention * n_nodes)))


def auto_retention(scores: Mapping[str, Tensor], mass: float | None = None) -> dict[str, float]:
    """Each group's retention under `retention="auto"`: the fewest top nodes holding `mass` of its total score.

    The count k is the smallest such that the k highest scores add up to at least `mass` (default
    `AUTO_RETAIN_MASS`) of the group's sum; the retention k / n is then held within
    `AUTO_RETENTION_BOUNDS` (a group whose scores are all zero gets the lower bound).

    Example:
        >>> auto_retention({"ffn": torch.tensor([8.0, 1.0, 1.0, 0.0] + [0.0] * 16)})
        {'ffn': 0.05}
        >>> auto_retention({"ffn": torch.ones(10)})
        {'ffn': 0.5}
    """
    mass = AUTO_RETAIN_MASS if mass is None else mass
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass is the share of a group's total score its learners hold, in (0, 1]; got {mass!r}")
    low, high = AUTO_RETENTION_BOUNDS
    chosen = {}
    for name, s in scores.items():
        s = s.double().flatten()  # (n,)
        total = float(s.sum())
        if s.numel() == 0:
            raise ValueError(f"{name} has no nodes to score")
        if not total > 0:  # all zero (or not finite): nothing to tell the nodes apart
            chosen[name] = low
            continue
        held = torch.sort(s, descending=True).values.cumsum(0)  # (n,) score of the top 1, 2, ... n nodes
        # The tolerance keeps k from slipping one node past where the sum holds `mass` exactly.
        k = int((held < mass * total * (1 - 1e-12)).sum()) + 1
        chosen[name] = min(high, max(low, k / s.numel()))
    return chosen


def auto_counts(scores: Mapping[str, Tensor]) -> dict[str, int]:
    """Learners per group under `retention="auto"`: `learner_count(n, auto_retention(...)[group])`."""
    return {name: learner_count(scores[name].numel(), r) for name, r in auto_retention(scores).items()}


def _top(scores: Tensor, k: int) -> Tensor:
    # A stable descending sort keeps equal scores in index order: the lower index wins a tie.
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k].sort().values


def _random_nodes(n_nodes: Mapping[str, int], counts: Mapping[str, int], seed: int) -> dict[str, Tensor]:
    """`counts[name]` of each group's `n_nodes[name]` nodes drawn uniformly, reproducibly from `seed`, in order."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randperm(n, generator=generator)[: counts[name]].sort().values for name, n in n_nodes.items()}


def select_per_layer(scores: Mapping[str, Tensor], retention: float) -> dict[str, Tensor]:
    """The top `learner_count(n, retention)` nodes of each FFN."""
    return {name: _top(s, learner_count(s.numel(), retention)) for name, s in scores.items()}


def select_global(scores: Mapping[str, Tensor], retention: float, *, budget: int | None = None) -> dict[str, Tensor]:
    """The top round(retention * N) nodes over all N nodes (or `budget` nodes), at least one per FFN.

    Each FFN first keeps its best node; the rest of the budget goes to the highest remaining
    scores across all FFNs.
    """
    names = list(scores)
    sizes = [scores[n].numel() for n in names]
    if budget is None:
        budget = round(retention * sum(sizes))
    budget = max(len(names), budget)
    flat = torch.cat([scores[n].float() for n in names])
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    for i, name in enumerate(names):  # the guaranteed one per FFN
        chosen[offsets[i] + _top(scores[name], 1)] = True
    rest = torch.where(chosen, torch.tensor(-math.inf), flat)
    order = torch.sort(rest, descending=True, stable=True).indices
    chosen[order[: budget - len(names)]] = True
    return {name: chosen[offsets[i] : offsets[i + 1]].nonzero().flatten() for i, name in enumerate(names)}


def _positions(names: Mapping[str, object], layer_of: Mapping[str, int] | None) -> dict[str, int]:
    """Each group's layer index: `layer_of`, or the groups' order (one group per layer)."""
    if layer_of is None:
        return {name: i for i, name in enumerate(names)}
    missing = [name for name in names if name not in layer_of]
    if missing:
        raise ValueError(f"layer_of has no layer index for {missing[:3]}; give one for every group")
    return {name: int(layer_of[name]) for name in names}


def layer_changes(scores: Mapping[str, Tensor], layer_of: Mapping[str, int] | None = None) -> Tensor:
    """Each layer's change during priming: the mean score of its FFN nodes, (L,) float64, bottom layer first.

    Example:
        >>> layer_changes({"a": torch.tensor([0.1, 0.3]), "b": torch.ones(2)})
        tensor([0.2000, 1.0000], dtype=torch.float64)
    """
    layers = _positions(scores, layer_of)
    n_layers = max(layers.values()) + 1
    total = torch.zeros(n_layers, dtype=torch.float64)
    nodes = torch.zeros(n_layers, dtype=torch.float64)
    for name, s in scores.items():
        total[layers[name]] += s.double().sum()
        nodes[layers[name]] += s.numel()
    return total / nodes.clamp(min=1)  # wide and narrow layers weigh alike


def auto_freeze_layers(scores: Mapping[str, Tensor], layer_of: Mapping[str, int] | None = None) -> int:
    """How many bottom layers `freeze_layers="auto"` freezes, from the FFNs' priming scores.

    Each layer's change is the mean score of its nodes (`layer_changes`); K is the largest count
    such that the bottom K layers' changes add up to less than `AUTO_FREEZE_MASS` of all layers'
    changes, capped so that at least one layer stays trainable.

    Example:
        >>> auto_freeze_layers({"a": torch.tensor([0.1, 0.1]), "b": torch.ones(2), "c": torch.ones(2)})
        1
    """
    change = layer_changes(scores, layer_of)  # (L,)
    n_layers = change.numel()
    below = change.cumsum(0)  # (L,) change of the bottom 1, 2, ... L layers
    threshold = AUTO_FREEZE_MASS * float(change.sum())
    k = max((i + 1 for i in range(n_layers) if float(below[i]) < threshold), default=0)
    return min(k, n_layers - 1)


def _shares(sizes: list[int], budget: int) -> list[int]:
    """`budget` split over groups of `sizes` nodes in proportion to their sizes, at least 1 each.

    Largest remainders get the leftover units (ties: the earlier group), so the shares add up to
    the budget exactly whenever it is at least one per group.
    """
    total = sum(sizes)
    shares = [budget * n // total for n in sizes]
    remainders = [budget * n % total for n in sizes]
    for i in sorted(range(len(sizes)), key=lambda i: -remainders[i])[: budget - sum(shares)]:
        shares[i] += 1
    return [max(1, share) for share in shares]


def select_depth(
    config: FARConfig,
    *,
    n_nodes: Mapping[str, int],
    scores: Mapping[str, Tensor] | None = None,
    layer_of: Mapping[str, int] | None = None,
) -> dict[str, Tensor]:
    """Learners of every group (`n_nodes`, in module order) under `config.freeze_layers`: none below layer K (empty
    index tensors), the budget above. `layer_of` defaults to the groups in order being layers 0, 1, ..."""
    if config.freeze_layers is None:
        raise ValueError("select_depth needs a config with freeze_layers set; use select_learners otherwise")
    if scores is None and config.selection != "random":
        raise ValueError(f"{config.selection!r} selection needs priming scores")
    layers = _positions(n_nodes, layer_of)
    n_layers = max(layers.values()) + 1
    if config.freeze_layers == AUTO:
        if scores is None:
            raise ValueError("freeze_layers='auto' needs priming scores; give scores=..., or an int freeze_layers")
        k = auto_freeze_layers(scores, layers)
    else:
        k = config.freeze_layers
    if k >= n_layers:
        raise ValueError(
            f"freeze_layers={k} would freeze every layer of {n_layers}; at most {n_layers - 1} leaves one to train"
        )
    trainable = [name for name in n_nodes if layers[name] >= k]
    sizes = [n_nodes[name] for name in trainable]
    if config.retention == AUTO:
        counts = auto_counts({name: scores[name] for name in trainable})
        budget = sum(counts.values())
    else:
        # Freezing layers moves their share of the budget up; it shrinks only where the layers above are full.
        budget = min(sum(sizes), max(len(trainable), round(config.retention * sum(n_nodes.values()))))
    if config.selection == "global":
        chosen = select_global({name: scores[name] for name in trainable}, config.retention, budget=budget)
    else:
        if config.retention != AUTO or config.selection == "random":
            counts = dict(zip(trainable, _shares(sizes, budget), strict=True))
        if config.selection == "random":
            chosen = _random_nodes({name: n_nodes[name] for name in trainable}, counts, config.seed)
        else:
            chosen = {name: _top(scores[name], counts[name]) for name in trainable}
    empty = torch.empty(0, dtype=torch.int64)
    return {name: chosen.get(name, empty) for name in n_nodes}


def select_random(n_nodes: Mapping[str, int], retention: float, seed: int) -> dict[str, Tensor]:
    """`learner_count(n, retention)` nodes of each FFN drawn uniformly, reproducibly from `seed`."""
    return _random_nodes(n_nodes, {name: learner_count(n, retention) for name, n in n_nodes.items()}, seed)


def select_learners(
    config: FARConfig | float = UNSET,
    *,
    scores: Mapping[str, Tensor] | None = None,
    n_nodes: Mapping[str, int] | None = None,
    retention: float | None = None,
    selection: str | None = None,
    seed: int | None = None,
    freeze_layers: int | str | None = None,
    layer_of: Mapping[str, int] | None = None,
) -> dict[str, Tensor]:
    """Learner node indices (sorted, int64) of every FFN.

    Args:
        config: A `far.FARConfig`, or the retention (fraction of nodes kept trainable, in (0, 1], or
            "auto": see `auto_retention`).
        scores: `{ffn_name: (n,) scores}`; needed by "per_layer" and "global".
        n_nodes: `{ffn_name: n}`; needed by "random" when no scores are given.
        retention / selection / seed / freeze_layers: The config's fields, as keywords: the
            retention, "per_layer" (default), "global" or "random", the seed of "random", the
            bottom layers that get no learners (see `select_depth`).
        layer_of: `{ffn_name: layer index}` for `freeze_layers`; default: the FFNs in order.

    Example:
        >>> select_learners(0.5, scores={"ffn": torch.tensor([0.1, 0.9, 0.5, 0.2])})
        {'ffn': tensor([1, 2])}
    """
    config = as_config(config, retention=retention, selection=selection, seed=seed, freeze_layers=freeze_layers)
    if n_nodes is None and scores is not None:
        n_nodes = {name: s.numel() for name, s in scores.items()}
    if config.freeze_layers is not None and n_nodes is not None:
        return select_depth(config, n_nodes=n_nodes, scores=scores, layer_of=layer_of)
    if config.selection == "random":
        if n_nodes is None:
            raise ValueError("random selection needs n_nodes (or scores, for their sizes)")
        return select_random(n_nodes, config.retention, config.seed)
    if scores is None:
        raise ValueError(f"{config.selection!r} selection needs priming scores")
    if config.retention == AUTO:
        counts = auto_counts(scores)
        if config.selection == "global":
            return select_global(scores, 0.0, budget=sum(counts.values()))
        return {name: _top(s, counts[name]) for name, s in scores.items()}
    if config.selection == "global":
        return select_global(scores, config.retention)
    return select_per_layer(scores, config.retention)
