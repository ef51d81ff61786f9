"""Priming: how far each FFN node moved during a short pass of ordinary fine-tuning."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from far.architectures import FFN, FFNSpec, find_ffns
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows

# The latest Primer of each model, so that `reconfigure(model)` right after priming finds its
# scores. Weak keys: a model that goes away takes its entry with it.
_LATEST: weakref.WeakKeyDictionary[nn.Module, Primer] = weakref.WeakKeyDictionary()


def latest_primer(model: nn.Module) -> Primer | None:
    """The most recent `Primer` created on `model`, if any."""
    return _LATEST.get(model)


def forget_primer(model: nn.Module) -> None:
    """Drop the registry's reference to `model`'s Primer, so its snapshot can be freed."""
    _LATEST.pop(model, None)


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
        >>> far.reconfigure(model, retention=0.4)  # uses primer.scores()
    """

    def __init__(self, model: nn.Module, spec: FFNSpec | None = None) -> None:
        self.ffns: dict[str, FFN] = find_ffns(model, spec)
        modules = dict(model.named_modules())
        if any(isinstance(modules[f.name], SplitLinear) for f in self.ffns.values()):
            raise ValueError(
                "this model is already reconfigured by FAR; prime the plain model, or call far.restore(model) first"
            )
        # Only the projections: holding the root module would keep the model (the weak key) alive.
        self._modules = {name: modules[name] for ffn in self.ffns.values() for name in (*ffn.inputs, ffn.output)}
        self._snapshot: dict[str, Tensor] = {}
        for ffn in self.ffns.values():
            for name in (*ffn.inputs, ffn.output):
                module = modules[name]
                role = INPUT if name in ffn.inputs else OUTPUT
                self._snapshot[f"{name}.weight"] = node_rows(module, role).to("cpu", copy=True)  # (n, f)
                if name in ffn.inputs and module.bias is not None:
                    self._snapshot[f"{name}.bias"] = module.bias.detach().to("cpu", copy=True)
        _LATEST[model] = self

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
