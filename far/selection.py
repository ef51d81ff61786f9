"""Selection: from node scores and a retention fraction to the learner nodes of every FFN.

Pure functions of their arguments. Ties are broken towards the lower node index (and, for the
global strategy, towards the earlier FFN), so a selection never depends on sort internals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from far.config import UNSET, FARConfig, as_config


def learner_count(n_nodes: int, retention: float) -> int:
    """Learners kept in an FFN of `n_nodes` nodes: round(retention * n), at least 1."""
    return min(n_nodes, max(1, round(retention * n_nodes)))


def _top(scores: Tensor, k: int) -> Tensor:
    # A stable descending sort keeps equal scores in index order: the lower index wins a tie.
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k].sort().values


def select_per_layer(scores: Mapping[str, Tensor], retention: float) -> dict[str, Tensor]:
    """The top `learner_count(n, retention)` nodes of each FFN."""
    return {name: _top(s, learner_count(s.numel(), retention)) for name, s in scores.items()}


def select_global(scores: Mapping[str, Tensor], retention: float) -> dict[str, Tensor]:
    """The top round(retention * N) nodes over all N nodes, at least one per FFN.

    Each FFN first keeps its best node; the rest of the budget goes to the highest remaining
    scores across all FFNs.
    """
    names = list(scores)
    sizes = [scores[n].numel() for n in names]
    budget = max(len(names), round(retention * sum(sizes)))
    flat = torch.cat([scores[n].float() for n in names])
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    for i, name in enumerate(names):  # the guaranteed one per FFN
        chosen[offsets[i] + _top(scores[name], 1)] = True
    rest = torch.where(chosen, torch.tensor(-math.inf), flat)
    order = torch.sort(rest, descending=True, stable=True).indices
    chosen[order[: budget - len(names)]] = True
    return {name: chosen[offsets[i] : offsets[i + 1]].nonzero().flatten() for i, name in enumerate(names)}


def select_random(n_nodes: Mapping[str, int], retention: float, seed: int) -> dict[str, Tensor]:
    """`learner_count(n, retention)` nodes of each FFN drawn uniformly, reproducibly from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randperm(n, generator=generator)[: learner_count(n, retention)].sort().values
        for name, n in n_nodes.items()
    }


def select_learners(
    config: FARConfig | float = UNSET,
    *,
    scores: Mapping[str, Tensor] | None = None,
    n_nodes: Mapping[str, int] | None = None,
    retention: float | None = None,
    selection: str | None = None,
    seed: int | None = None,
) -> dict[str, Tensor]:
    """Learner node indices (sorted, int64) of every FFN.

    Args:
        config: A `far.FARConfig`, or the retention (fraction of nodes kept trainable, in (0, 1]).
        scores: `{ffn_name: (n,) scores}`; needed by "per_layer" and "global".
        n_nodes: `{ffn_name: n}`; needed by "random" when no scores are given.
        retention / selection / seed: The config's fields, as keywords: the retention,
            "per_layer" (default), "global" or "random", the seed of "random".

    Example:
        >>> select_learners(0.5, scores={"ffn": torch.tensor([0.1, 0.9, 0.5, 0.2])})
        {'ffn': tensor([1, 2])}
    """
    config = as_config(config, retention=retention, selection=selection, seed=seed)
    if config.selection == "random":
        if n_nodes is None:
            if scores is None:
                raise ValueError("random selection needs n_nodes (or scores, for their sizes)")
            n_nodes = {name: s.numel() for name, s in scores.items()}
        return select_random(n_nodes, config.retention, config.seed)
    if scores is None:
        raise ValueError(f"{config.selection!r} selection needs priming scores")
    if config.selection == "global":
        return select_global(scores, config.retention)
    return select_per_layer(scores, config.retention)
