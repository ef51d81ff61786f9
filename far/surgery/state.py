"""What a reconfigured model holds: the record of its surgery, its node groups and their learner nodes.

Read-only: nothing here changes a model. `far.surgery.reconfigure` writes what these functions read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from far.architectures import (
    AttentionSpec,
    FFNSpec,
    NodeGroup,
    check_model,
    expand_nodes,
    find_attention,
    find_ffns,
    projection_rows,
)
from far.config import FARConfig
from far.layers import INPUT, OUTPUT, SplitLinear

STATE_ATTRIBUTE = "far_state"


@dataclass(frozen=True)
class FARState:
    """What `reconfigure` did to a model, kept on it as `model.far_state` until `restore`."""

    config: FARConfig
    frozen_embeddings: tuple[str, ...] = ()  # parameter names that FAR froze, unfrozen on restore
    frozen_layers: int = 0  # bottom layers frozen whole (freeze_layers, "auto" resolved)
    frozen_parameters: tuple[str, ...] = ()  # their parameters FAR froze, as the plain model names them


def is_reconfigured(model: nn.Module) -> bool:
    return any(isinstance(m, SplitLinear) for m in model.modules())


def get_config(model: nn.Module) -> FARConfig | None:
    """The `FARConfig` a model was reconfigured with, or None for a plain model."""
    state = getattr(model, STATE_ATTRIBUTE, None)
    return state.config if isinstance(state, FARState) else None


def node_groups(
    model: nn.Module,
    spec: FFNSpec | None = None,
    *,
    attention: bool | None = None,
    attention_spec: AttentionSpec | None = None,
) -> dict[str, NodeGroup]:
    """The FFNs of `model`, then its attention blocks if `attention` (None: if FAR has split them)."""
    groups = dict(find_ffns(model, spec))
    if attention is None:
        attention = _heads_split(model, attention_spec)
    if attention:
        groups.update(find_attention(model, attention_spec))
    return groups


def _heads_split(model: nn.Module, attention_spec: AttentionSpec | None) -> bool:
    config = get_config(model)
    if config is not None:
        return config.attention_retention is not None
    # A model split by hand or loaded without its state: look at the layers.
    blocks = attention_if_splittable(model, attention_spec)
    return any(isinstance(model.get_submodule(name), SplitLinear) for name in blocks)


def attention_if_splittable(model: nn.Module, attention_spec: AttentionSpec | None) -> dict[str, NodeGroup]:
    """The attention blocks of `model`, or none where its heads cannot be split (so none can be split already)."""
    try:
        return find_attention(model, attention_spec)
    except ValueError:
        return {}


def projection_learners(model: nn.Module, group: NodeGroup, name: str, nodes: Tensor) -> Tensor:
    """A group's learner nodes as rows of one of its projections (`name`), `width` rows a node."""
    role = OUTPUT if name == group.output else INPUT
    return expand_nodes(nodes, projection_rows(model.get_submodule(name), role) // group.n_nodes)


def learners(
    model: nn.Module, spec: FFNSpec | None = None, *, attention_spec: AttentionSpec | None = None
) -> dict[str, Tensor]:
    """Sorted original indices of every FFN's learner nodes, keyed like the priming scores.

    Where FAR split the attention too, the result also holds each attention block's learner heads
    (key/value groups under grouped-query attention), keyed by its output projection's name.
    """
    check_model(model)
    result = {}
    for group in node_groups(model, spec, attention_spec=attention_spec).values():
        module = model.get_submodule(group.name)
        if not isinstance(module, SplitLinear):
            raise ValueError("this model is not reconfigured by FAR; call far.reconfigure(model, ...) first")
        result[group.name] = _nodes_of_rows(module.learner_indices(), module.n_nodes // group.n_nodes)
    return result


def learners_from_state_dict(
    model: nn.Module,
    state_dict: Mapping[str, Tensor],
    spec: FFNSpec | None = None,
    *,
    attention_spec: AttentionSpec | None = None,
) -> dict[str, Tensor]:
    """Learner indices recorded in the `state_dict` of a reconfigured model of `model`'s architecture.

    With `reconfigure_with_learners`, this rebuilds a saved FAR layout on a plain model before
    loading the saved weights into it. Attention blocks are included when the state dict records
    split heads.
    """
    groups = node_groups(model, spec, attention=False)
    blocks = attention_if_splittable(model, attention_spec)
    if any(f"{name}.node_order" in state_dict for name in blocks):
        groups.update(blocks)
    result = {}
    for group in groups.values():
        name = group.name
        order, weight = state_dict.get(f"{name}.node_order"), state_dict.get(f"{name}.learner_weight")
        if order is None or weight is None:
            raise ValueError(
                f"the state dict has no FAR layout for the {'FFN' if group.kind == 'ffn' else 'attention block'} "
                f"{name!r} (no {name}.node_order); was it saved from a reconfigured model of this architecture?"
            )
        rows = order[: weight.shape[0]].sort().values  # nodes are stored as rows
        result[name] = _nodes_of_rows(rows, order.numel() // group.n_nodes)
    return result


def _nodes_of_rows(rows: Tensor, width: int) -> Tensor:
    """Sorted row indices, `width` per node -> the node indices (the inverse of `expand_nodes`)."""
    return rows[::width] // width
