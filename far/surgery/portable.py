"""Portable learners: after selection, what FAR freezes goes back to its pre-priming value.

Priming trains every weight, so the frozen nodes (and frozen heads and embeddings) hold *primed*
values that exist only in this process, and a learners file would fit only that primed model. Put
back to their pre-priming values (the `far.Primer`'s snapshot), the model is "stock base + the
file's tensors", and the file applies to the stock model every user has. What stays trainable keeps
its primed values: that is what the file stores.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from far.architectures import NodeGroup
from far.layers import INPUT, SplitLinear
from far.priming import Primer


def check_resettable(primer: Primer, groups: Mapping[str, NodeGroup], others: Iterable[str]) -> None:
    """Raise unless `primer` holds the pre-priming value of everything a reconfiguration will freeze: the `groups`
    to split and `others`, the parameters frozen whole (embeddings, and the frozen bottom layers' other tensors)."""
    for group in groups.values():
        for name in group.projections:
            if primer.snapshot(f"{name}.weight") is None:
                unit = "FFN" if group.kind == "ffn" else "attention block"
                hint = "far.Primer(model, heads=True)" if group.kind != "ffn" else "the Primer of this model"
                raise ValueError(
                    f"reset_frozen=True puts the frozen nodes back to their pre-priming values, but the Primer has "
                    f"no snapshot of the {unit} projection {name!r}: create {hint} before priming, or pass "
                    "reset_frozen=False to keep the primed values (the learners file then fits only this primed model)"
                )
    moved = [name for name in others if name in primer.trainable and primer.snapshot(name) is None]
    if moved:
        embeddings_only = all(name in primer.trainable_embeddings for name in moved)
        option = "embeddings=True" if embeddings_only else "everything=True"
        raise ValueError(
            f"reset_frozen=True freezes {moved[:2]}{' ...' if len(moved) > 2 else ''} again at their pre-priming "
            f"values, but they trained during priming and the Primer did not keep them: create "
            f"far.Primer(model, {option}) (far.finetune does), or pass reset_frozen=False to keep the primed values"
        )


@torch.no_grad()
def reset_values(model: nn.Module, primer: Primer, groups: Mapping[str, NodeGroup], others: Iterable[str]) -> None:
    """Copy the pre-priming values back into every frozen node of `groups` and into `others`, in place.

    `model` is reconfigured (its groups split); `check_resettable` has passed. Learner nodes, the
    output projection's bias (it belongs to no node and keeps its trainability) and every other
    tensor keep their current values.
    """
    for group in groups.values():
        for name in group.projections:
            module = model.get_submodule(name)
            if not isinstance(module, SplitLinear):
                raise TypeError(f"{name} is not split; reset_frozen runs after the surgery")
            frozen_rows = module.node_order[module.n_learners :].cpu()  # stored frozen position -> original row
            before = primer.snapshot(f"{name}.weight")  # (n, f), original order
            module.frozen_weight.copy_(before[frozen_rows].to(module.frozen_weight.device))
            if module.role == INPUT and module.frozen_bias is not None:
                bias = primer.snapshot(f"{name}.bias")
                module.frozen_bias.copy_(bias[frozen_rows].to(module.frozen_bias.device))
    for name in others:
        before = primer.snapshot(name)
        if before is not None:  # None: the tensor did not train during priming, so it never moved
            model.get_parameter(name).copy_(before)
