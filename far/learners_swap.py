"""`far.load_learners` and `far.unload_learners`: one verb for a user's learners file, whatever the model.

An encoder's file (`far.saving`, a fingerprint of its frozen weights) and a GGUF causal LM's
(`far.llm.lean_learners`, the GGUF file's sha256) are checked and applied differently; the model
says which. The encoders' code is imported only when an encoder is given, so a GGUF model's process
never imports transformers.

    >>> far.load_learners(model, "alice.safetensors")   # an encoder or a lean GGUF causal LM
    >>> far.unload_learners(model)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from torch import nn

from far import saving
from far.llm import lean_learners
from far.llm.lean_model import LeanCausalLM

if TYPE_CHECKING:  # far.architectures imports transformers, which a GGUF model's process never needs
    from far.architectures import FFNSpec


def load_learners(model: nn.Module, path: str | os.PathLike, *, spec: FFNSpec | None = None) -> nn.Module:
    """Apply a learners file to its base model, in place, swapping out the one it holds.

    Args:
        model: An encoder (`far.saving.load_learners`) or a lean GGUF causal LM
            (`far.llm.lean_learners.load_learners`).
        path: The file.
        spec: An encoder's FFN layout, for architectures that are not built in.

    Returns:
        The same model.
    """
    if isinstance(model, LeanCausalLM):
        if spec is not None:
            raise ValueError("spec describes an encoder's FFNs; a GGUF causal LM's are built in (drop spec)")
        return lean_learners.load_learners(model, path)
    return saving.load_learners(model, path, spec=spec)


def unload_learners(model: nn.Module) -> nn.Module:
    """Take the active learners file off `model`, in place: the base model again, bit for bit."""
    if isinstance(model, LeanCausalLM):
        return lean_learners.unload_learners(model)
    return saving.unload_learners(model)
