"""Priming: how far each FFN node moved during a short pass of ordinary fine-tuning.

A `Primer` attaches itself to the model it watches, as `model.far_primer` (the one attribute it
sets), so that `far.reconfigure(model, ...)` right after priming finds its scores without being
handed them. Scores travel only with the model they were recorded on: another model's Primer is
never picked up, and `reconfigure` detaches the Primer (freeing its snapshot) once it is used.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from far.architectures import FFN, FFNSpec, find_ffns
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows

PRIMER_ATTRIBUTE = "far_primer"


def primer_of(model: nn.Module) -> Primer | None:
    """The `Primer` attached to `model` (the latest created on it), or None."""
    primer = getattr(model, PRIMER_ATTRIBUTE, None)
    # A deep copy of a primed model carries a copy of the Primer, still watching the original.
    return primer if isinstance(primer, Primer) and primer.watches(model) else None


def detach_primer(model: nn.Module) -> None:
    """Drop `model`'s reference to its Primer, so that the Primer's snapshot can be freed."""
    if hasattr(model, PRIMER_ATTRIBUTE):
        delattr(model, PRIMER_ATTRIBUTE)


class Primer:
    """Snapshots a model's FFN weights, then scores each node by how much it changed.

    Create it before the priming steps and call `scores()` after them; the training loop is the
    caller's own. The snapshot holds only the FFN projections, on CPU, in the model's dtype.

    Args:
        model: A plain (not reconfigured) model.
        spec: FFN layout for architectures that are not built in.

    Example:
        >>> primer = far.Primer(model)
        >>> for batch in first_tenth_of_the_batches:
        ...     model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> far.reconfigure(model, retention=0.4)  # uses the attached primer's scores
        >>> far.reconfigure(other_model, retention=0.4, scores=primer)  # ValueError: another model's
    """

    def __init__(self, model: nn.Module, spec: FFNSpec | None = None) -> None:
        self.ffns: dict[str, FFN] = find_ffns(model, spec)
        modules = dict(model.named_modules())
        if any(isinstance(modules[f.name], SplitLinear) for f in self.ffns.values()):
            raise ValueError(
                "this model is already reconfigured by FAR; prime the plain model, or call far.restore(model) first"
            )
        # The model holds its Primer, so the Primer holds the model weakly (no cycle) and its
        # projections strongly (the snapshot is compared with them).
        self._model = weakref.ref(model)
        self._modules = {name: modules[name] for ffn in self.ffns.values() for name in (*ffn.inputs, ffn.output)}
        self._snapshot: dict[str, Tensor] = {}
        for ffn in self.ffns.values():
            for name in (*ffn.inputs, ffn.output):
                module = modules[name]
                role = INPUT if name in ffn.inputs else OUTPUT
                self._snapshot[f"{name}.weight"] = node_rows(module, role).to("cpu", copy=True)  # (n, f)
                if name in ffn.inputs and module.bias is not None:
                    self._snapshot[f"{name}.bias"] = module.bias.detach().to("cpu", copy=True)
        setattr(model, PRIMER_ATTRIBUTE, self)  # a plain attribute: not a submodule, not in the state dict

    def watches(self, model: nn.Module) -> bool:
        """Whether this Primer was created on `model` (the very object, not a copy)."""
        return self._model() is model

    @torch.no_grad()
    def scores(self) -> dict[str, Tensor]:
        """L1 weight change of every node since the snapshot.

        Returns:
            `{output_projection_name: (n_nodes,) float32 tensor}` where node *i* scores
            sum_j |dW_in[i, j]| + |db_in[i]| over the input projections, plus sum_j |dW_out[j, i]|.
        """
        result = {}
        for ffn in self.ffns.values():
            score = torch.zeros(ffn.n_nodes, dtype=torch.float32)
            for name in (*ffn.inputs, ffn.output):
                module = self._modules[name]
                rows = node_rows(module, INPUT if name in ffn.inputs else OUTPUT)  # (n, f), one row per node
                score += self._delta(f"{name}.weight", rows).sum(dim=1)
                if name in ffn.inputs and module.bias is not None:
                    score += self._delta(f"{name}.bias", module.bias.detach())
            result[ffn.name] = score
        return result

    def _delta(self, key: str, current: Tensor) -> Tensor:
        before = self._snapshot[key]
        if not isinstance(current, Tensor) or current.shape != before.shape:
            raise ValueError(
                f"{key} changed shape or type since the Primer was created; create the Primer "
                "after any change to the model's structure"
            )
        return (current.to("cpu", torch.float32) - before.float()).abs()
