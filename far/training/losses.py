"""What a `far.finetune` run computes its loss and scores with: `loss_fn(model, batch)`, `eval_fn(model)`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

LossFn = Callable[[nn.Module, Any], Tensor]
EvalFn = Callable[[nn.Module], Mapping[str, float]]


def default_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    """`model(**batch).loss`, the loss a transformers model computes when the batch has labels."""
    output = model(**batch)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model returned no loss: give the examples labels (a 'labels' field), or pass loss_fn=")
    return loss
