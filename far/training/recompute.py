"""Layer recompute in backward (transformers' activation checkpointing), across transformers 5.x.

transformers 5.2x names it `activation_checkpointing_enable` / `is_activation_checkpointing` and keeps the
`gradient_checkpointing_*` names as deprecated aliases (a warning per call, removed in v6); earlier 5.x releases
and far's lean encoder have only the `gradient_checkpointing_*` names. These read whichever the model has.
"""

from __future__ import annotations

from torch import nn


def _method(model: nn.Module, action: str):
    for name in (f"activation_checkpointing_{action}", f"gradient_checkpointing_{action}"):
        method = getattr(model, name, None)
        if callable(method):
            return method
    return None


def can_recompute_layers(model: nn.Module) -> bool:
    """Whether the model can recompute its layers in backward."""
    return _method(model, "enable") is not None


def recomputes_layers(model: nn.Module) -> bool:
    """Whether the model already recomputes its layers in backward."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def recompute_layers(model: nn.Module, on: bool) -> None:
    """Turns layer recompute in backward on or off."""
    method = _method(model, "enable" if on else "disable")
    if method is None:
        raise ValueError(f"{type(model).__name__} cannot recompute its layers in backward")
    method()
