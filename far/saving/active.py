"""The learners file a model holds, and the base values it overwrote: what makes users swappable.

`far.load_learners(model, user_b)` on a model holding user A's file first puts back the base values of
everything A overwrote, then applies B. The copy (`model.far_learners`) holds exactly what the active
file overwrote: the memory is the base plus one file, never a model per user. It also keeps the base's
digests (`far.saving.digests`), so checking the next user's file hashes only what changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from far.saving.digests import DigestCache
from far.saving.labels import head_fields, set_head_fields
from far.surgery.reconfigure import restore
from far.surgery.state import is_reconfigured

ACTIVE_ATTRIBUTE = "far_learners"


@dataclass
class ActiveLearners:
    """The learners file applied to a model, kept on it as `model.far_learners`.

    Attributes:
        base: `{parameter name: value before the file was applied}`, in the model's current layout.
        relayout: The model was plain before this file split it, so another file may split it with other
            learners (and `unload_learners` merges it back).
        digests: Digests of the base values, reused by the next swap's check.
        verified: `{file identity: content sha256}` of the files this model verified (not hashed again).
        labels: The base's head labels, which the file's replace on the model's config until unloaded.
    """

    path: str
    content_sha256: str
    relayout: bool
    base: dict[str, Tensor] = field(default_factory=dict, repr=False)
    digests: DigestCache = field(default_factory=DigestCache, repr=False, compare=False)
    verified: dict[tuple, str] = field(default_factory=dict, repr=False, compare=False)
    labels: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.base.values())


def active_learners(model: nn.Module) -> ActiveLearners | None:
    """The file `load_learners` applied to `model`, or None (also when the model changed shape since)."""
    active = getattr(model, ACTIVE_ATTRIBUTE, None)
    if not isinstance(active, ActiveLearners):
        return None
    params = dict(model.named_parameters())
    fits = all(name in params and params[name].shape == t.shape for name, t in active.base.items())
    return active if fits and is_reconfigured(model) else None  # far.restore(model) since: A is merged in


@torch.no_grad()
def remember(
    model: nn.Module,
    names: Iterable[str],
    *,
    path: str,
    content_sha256: str,
    relayout: bool,
    digests: DigestCache | None = None,
    verified: dict[tuple, str] | None = None,
) -> ActiveLearners:
    """Keep a copy of every parameter in `names` (and the head's labels) before a file overwrites them."""
    digests = DigestCache() if digests is None else digests
    params = dict(model.named_parameters(remove_duplicate=False))
    base = {}
    for name in names:
        param = params[name].detach()
        base[name] = param.clone()
        digests.carry(param, base[name])  # the same bytes: the same digests
    verified = {} if verified is None else verified
    active = ActiveLearners(path, content_sha256, relayout, base, digests, verified, head_fields(model))
    setattr(model, ACTIVE_ATTRIBUTE, active)
    return active


@torch.no_grad()
def revert(model: nn.Module, active: ActiveLearners) -> None:
    """Copy the base values (and labels) back over what `active` overwrote, and forget it (the layout stays)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, value in active.base.items():
        param = params[name]
        param.copy_(value)
        active.digests.carry(value, param.detach())
    set_head_fields(model, active.labels)
    delattr(model, ACTIVE_ATTRIBUTE)


def unload_learners(model: nn.Module) -> nn.Module:
    """Take the active learners file off `model`, in place: the base model again, bit for bit.

    A model that `far.load_learners` split is merged back into a plain model; one that was
    reconfigured before the file was loaded keeps its layout with its earlier values.

    Returns:
        The same model object.

    Example:
        >>> far.load_learners(base, "user-a.safetensors")
        >>> far.saving.unload_learners(base)  # the stock model again
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    active = active_learners(model)
    if active is None:
        raise ValueError("no learners file is loaded on this model (far.load_learners(model, path) loads one)")
    revert(model, active)
    if active.relayout:
        restore(model)
    return model
