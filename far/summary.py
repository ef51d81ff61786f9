"""A one-screen account of what a (reconfigured) model trains."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from far.architectures import check_model, find_attention
from far.freezing import frozen_depth
from far.layers import INPUT, SplitLinear


@dataclass(frozen=True)
class Summary:
    """Parameter counts and, for a reconfigured model, learners per FFN (and per attention block split by heads)."""

    total_parameters: int
    trainable_parameters: int
    learners: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> (learners, nodes)
    attention_blocks: frozenset[str] = frozenset()  # the groups in `learners` whose nodes are heads
    # (bottom layers frozen whole, all layers, whether everything below them is frozen too: backward
    # then stops at the lowest trainable layer); (0, 0, False) where the layers cannot be found
    frozen_layers: tuple[int, int, bool] = (0, 0, False)

    @property
    def trainable_fraction(self) -> float:
        return self.trainable_parameters / max(1, self.total_parameters)

    def __repr__(self) -> str:
        # One line: `far.summary(model)` has printed the table already, and a REPL shows the returned value too.
        return (
            f"<far.Summary: {self.trainable_parameters:,} of {self.total_parameters:,} parameters trainable "
            f"({100 * self.trainable_fraction:.2f}%); print() it for the table>"
        )

    def __str__(self) -> str:
        lines = [
            f"trainable params: {self.trainable_parameters:,} || all params: {self.total_parameters:,} "
            f"|| trainable%: {100 * self.trainable_fraction:.4f}"
        ]
        frozen, n_layers, below = self.frozen_layers
        if frozen:
            stops = (
                (f"backward stops at layer {frozen}" if frozen < n_layers else "backward stops above the layers")
                if below
                else "backward still runs to the bottom (something below them trains, e.g. the embeddings)"
            )
            lines.append(f"frozen layers: 0-{frozen - 1} ({frozen} of {n_layers}), {stops}")
        for name, (k, n) in self.learners.items():
            unit = "heads" if name in self.attention_blocks else "nodes"
            lines.append(f"  {name}: {k:,}/{n:,} learner {unit} ({100 * k / n:.1f}%)")
        return "\n".join(lines)


def summary(model: nn.Module, *, verbose: bool = True) -> Summary:
    """Count total and trainable parameters and the learners of every split FFN and attention block.

    An attention block's learners are counted in heads (key/value groups under grouped-query
    attention), an FFN's in intermediate nodes. Bottom layers frozen whole (`freeze_layers`, or
    `far.freeze_layers` on a plain model) are reported with the layer backward stops at.

    Args:
        model: Any model, reconfigured or not.
        verbose: Print the summary (like PEFT's `print_trainable_parameters`).

    Returns:
        A `Summary`; `str(summary)` is what is printed, its `repr` one line (a REPL shows the returned value
        after the printed table: the table is shown once).
    """
    params = {id(p): p for p in check_model(model).parameters()}.values()  # tied weights count once
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
        frozen_layers=_frozen_layers(model),
    )
    if verbose:
        print(result)
    return result


def _frozen_layers(model: nn.Module) -> tuple[int, int, bool]:
    try:
        return frozen_depth(model)
    except ValueError:  # an architecture whose FFNs (hence layers) far cannot find unaided
        return (0, 0, False)


def _heads_per_block(model: nn.Module) -> dict[str, int]:
    """Output projection name -> heads, for architectures whose heads FAR can split (others: none)."""
    try:
        return {name: group.n_nodes for name, group in find_attention(model).items()}
    except ValueError:
        return {}
