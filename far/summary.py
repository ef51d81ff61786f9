"""A one-screen account of what a (reconfigured) model trains."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from far.architectures import find_attention
from far.layers import INPUT, SplitLinear


@dataclass(frozen=True)
class Summary:
    """Parameter counts and, for a reconfigured model, learners per FFN (and per attention block split by heads)."""

    total_parameters: int
    trainable_parameters: int
    learners: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> (learners, nodes)
    attention_blocks: frozenset[str] = frozenset()  # the groups in `learners` whose nodes are heads

    @property
    def trainable_fraction(self) -> float:
        return self.trainable_parameters / max(1, self.total_parameters)

    def __str__(self) -> str:
        lines = [
            f"trainable params: {self.trainable_parameters:,} || all params: {self.total_parameters:,} "
            f"|| trainable%: {100 * self.trainable_fraction:.4f}"
        ]
        for name, (k, n) in self.learners.items():
            unit = "heads" if name in self.attention_blocks else "nodes"
            lines.append(f"  {name}: {k:,}/{n:,} learner {unit} ({100 * k / n:.1f}%)")
        return "\n".join(lines)


def summary(model: nn.Module, *, verbose: bool = True) -> Summary:
    """Count total and trainable parameters and the learners of every split FFN and attention block.

    An attention block's learners are counted in heads (key/value groups under grouped-query
    attention), an FFN's in intermediate nodes.

    Args:
        model: Any model, reconfigured or not.
        verbose: Print the summary (like PEFT's `print_trainable_parameters`).

    Returns:
        A `Summary`; `str(summary)` is what is printed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    params = {id(p): p for p in model.parameters()}.values()  # tied weights count once
    heads = _heads_per_block(model)
    learners = {}
    for name, m in model.named_modules():
        if isinstance(m, SplitLinear) and m.role != INPUT:
            width = m.n_nodes // heads[name] if name in heads else 1  # a head is `width` columns
            learners[name] = (m.n_learners // width, m.n_nodes // width)
    result = Summary(
        total_parameters=sum(p.numel() for p in params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        learners=learners,
        attention_blocks=frozenset(heads) & frozenset(learners),
    )
    if verbose:
        print(result)
    return result


def _heads_per_block(model: nn.Module) -> dict[str, int]:
    """Output projection name -> heads, for architectures whose heads FAR can split (others: none)."""
    try:
        return {name: group.n_nodes for name, group in find_attention(model).items()}
    except ValueError:
        return {}
