"""Priming: how far each FFN node moved during a short pass of ordinary fine-tuning.

A `Primer` attaches itself to the model it watches, as `model.far_primer` (the one attribute it
sets), so that `far.reconfigure(model, ...)` right after priming finds its scores without being
handed them. Scores travel only with the model they were recorded on: another model's Primer is
never picked up, and `reconfigure` detaches the Primer (freeing its snapshot) once it is used.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from far.architectures import FFN, AttentionSpec, FFNSpec, NodeGroup, find_attention, find_ffns
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


def trainable_embeddings(model: nn.Module) -> list[str]:
    """Parameter names of the `nn.Embedding` weights that train (those `freeze_embeddings` freezes)."""
    return [
        f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad
    ]


def freeze_embeddings(model: nn.Module) -> None:
    """Stop the training of every `nn.Embedding` weight of `model` (`trainable_embeddings`)."""
    for name in trainable_embeddings(model):
        model.get_parameter(name).requires_grad_(False)


class Primer:
    """Snapshots a model's FFN weights, then scores each node by how much it changed.

    Create it before the priming steps and call `scores()` after them; the training loop is the
    caller's own. The snapshot holds only the FFN projections, on CPU, in the model's dtype, plus,
    with `heads=True`, the attention projections, whose heads `head_scores()` then scores, and,
    with `embeddings=True`, the trainable embedding matrices. `far.reconfigure` puts the nodes,
    heads and embeddings it freezes back to these pre-priming values (see `far.surgery.portable`), so that
    a learners file applies to the stock model.

    Args:
        model: A plain (not reconfigured) model.
        spec: FFN layout for architectures that are not built in.
        heads: Also score attention heads (for `far.reconfigure(..., attention_retention=...)`).
        attention_spec: Attention layout for architectures that are not built in.
        embeddings: Also snapshot every trainable `nn.Embedding` weight, for a reconfiguration with
            `freeze_embeddings=True`; it costs a copy of them until `reconfigure` (so it is off
            unless the embeddings will be frozen).
        everything: Snapshot every trainable tensor, for a reconfiguration with `freeze_layers`,
            which freezes whole layers (attention, norms) and all below them: a copy of the model
            until `reconfigure`.
        reference: `reference(parameter_name)` -> the tensor's value now, read from where the model came
            from (e.g. `far.saving.stock_reader` on its safetensors file): the Primer then keeps no copy,
            reading pre-priming values back when it scores and when the surgery resets frozen nodes.
            Checked against the model at creation (ValueError if any value differs).

    Example:
        >>> primer = far.Primer(model)
        >>> for batch in first_tenth_of_the_batches:
        ...     model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> far.reconfigure(model, retention=0.4)  # uses the attached primer's scores
        >>> far.reconfigure(other_model, retention=0.4, scores=primer)  # ValueError: another model's
    """

    def __init__(
        self,
        model: nn.Module,
        spec: FFNSpec | None = None,
        *,
        heads: bool = False,
        attention_spec: AttentionSpec | None = None,
        embeddings: bool = False,
        everything: bool = False,
        reference: Callable[[str], Tensor] | None = None,
    ) -> None:
        for name, flag in (("embeddings", embeddings), ("everything", everything)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.ffns: dict[str, FFN] = find_ffns(model, spec)
        self.blocks: dict[str, NodeGroup] = find_attention(model, attention_spec) if heads else {}
        modules = dict(model.named_modules())
        if any(isinstance(m, SplitLinear) for m in modules.values()):
            raise ValueError(
                "this model is already reconfigured by FAR; prime the plain model, or call far.restore(model) first"
            )
        # The model holds its Primer, so the Primer holds the model weakly (no cycle) and its
        # projections strongly (the snapshot is compared with them).
        self._model = weakref.ref(model)
        groups = [*self.ffns.values(), *self.blocks.values()]
        self._modules = {name: modules[name] for group in groups for name in group.projections}
        self._parameter_names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        self._snapshot: dict[str, Tensor] = {}
        # With a reference the pre-priming values are read from it when needed (a model file on disk)
        # instead of copied: the FFNs are 2/3 of an encoder's layers. It must hold them exactly now.
        self._reference = reference
        self._roles: dict[str, tuple[str, str]] = {}  # snapshot key -> (parameter name, role or "")
        for ffn in groups:
            for name in ffn.projections:
                module = modules[name]
                role = INPUT if name in ffn.inputs else OUTPUT
                self._keep(f"{name}.weight", module.weight, role, module)  # (n, f)
                if name in ffn.inputs and module.bias is not None:
                    self._keep(f"{name}.bias", module.bias, "", module)
        # Embeddings that priming may move; only these need their pre-priming value to be frozen again.
        self.trainable_embeddings = tuple(trainable_embeddings(model))
        # Every tensor that priming may move: only these need a pre-priming value to be frozen again.
        self.trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        extra = self.trainable if everything else self.trainable_embeddings if embeddings else ()
        for name in extra:
            if name not in self._roles:  # FFN and head projections are kept above, as node rows
                self._keep(name, model.get_parameter(name), "", None)
        setattr(model, PRIMER_ATTRIBUTE, self)  # a plain attribute: not a submodule, not in the state dict

    def watches(self, model: nn.Module) -> bool:
        """Whether this Primer was created on `model` (the very object, not a copy)."""
        return self._model() is model

    def _keep(self, key: str, tensor: Tensor, role: str, module: nn.Module | None) -> None:
        """Remember `tensor`'s value now under `key`: a copy, or with a reference the parameter's name
        after checking that the reference holds exactly this value (a copy where the reference lacks it)."""
        name = self._parameter_names[id(tensor)]
        self._roles[key] = (name, role)
        if self._reference is None:
            value = node_rows(module, role) if role else tensor.detach()
            self._snapshot[key] = value.to("cpu", copy=True)
            return
        try:
            stored = self._reference(name)
        except KeyError:  # not in the model's files (a head initialized at load time): kept as a copy
            self._snapshot[key] = (node_rows(module, role) if role else tensor.detach()).to("cpu", copy=True)
            return
        if stored.shape != tensor.shape or not torch.equal(stored.to(tensor.dtype), tensor.detach().cpu()):
            raise ValueError(
                f"the Primer's reference does not hold {name} as the model has it now; give the reference of the "
                "file this model was loaded from, unchanged since, or no reference (the Primer then copies it)"
            )

    def snapshot(self, key: str) -> Tensor | None:
        """The pre-priming value of `key` (`<projection>.weight` as node rows (n, f), `<projection>.bias`,
        or an embedding's parameter name), or None if it was not snapshotted."""
        if key in self._snapshot or key not in self._roles:
            return self._snapshot.get(key)
        name, role = self._roles[key]
        value = self._reference(name)
        return node_rows(self._modules[name.rsplit(".", 1)[0]], role, value) if role else value

    def state(self) -> dict[str, Tensor]:
        """The snapshot, `{key: pre-priming value}`, for a checkpoint taken during priming."""
        return dict(self._snapshot)

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Replace the snapshot by one `state()` returned (a run resumed during priming)."""
        if state.keys() != self._snapshot.keys():
            raise ValueError("the saved Primer snapshot does not fit this Primer (other projections or options)")
        bad = [k for k, t in state.items() if t.shape != self._snapshot[k].shape or t.dtype != self._snapshot[k].dtype]
        if bad:
            raise ValueError(f"the saved Primer snapshot has other shapes or dtypes ({bad[:3]}) than this model")
        self._snapshot = {k: t.to("cpu") for k, t in state.items()}

    @property
    def watches_heads(self) -> bool:
        """Whether it records attention heads (created with `heads=True`)."""
        return bool(self.blocks)

    @torch.no_grad()
    def scores(self) -> dict[str, Tensor]:
        """L1 weight change of every node since the snapshot.

        Returns:
            `{output_projection_name: (n_nodes,) float32 tensor}` where node *i* scores
            sum_j |dW_in[i, j]| + |db_in[i]| over the input projections, plus sum_j |dW_out[j, i]|.
        """
        return {ffn.name: self._group_score(ffn) for ffn in self.ffns.values()}

    @torch.no_grad()
    def head_scores(self) -> dict[str, Tensor]:
        """L1 weight change of every attention head since the snapshot (`heads=True` only).

        Returns:
            `{output_projection_name: (n_nodes,) float32 tensor}`: head *g* (key/value group *g*
            under grouped-query attention) scores the summed |change| of its rows of the query,
            key and value weights and biases and its columns of the output projection.
        """
        if not self.blocks:
            raise ValueError("this Primer does not record attention heads; create it as far.Primer(model, heads=True)")
        return {block.name: self._group_score(block) for block in self.blocks.values()}

    def _group_score(self, group: NodeGroup) -> Tensor:
        score = torch.zeros(group.n_nodes, dtype=torch.float32)
        for name in group.projections:
            module = self._modules[name]
            rows = node_rows(module, INPUT if name in group.inputs else OUTPUT)  # (n * width, f)
            # A node is `width` consecutive rows (a head's rows; 1 row in an FFN).
            score += self._delta(f"{name}.weight", rows).reshape(group.n_nodes, -1).sum(dim=1)
            if name in group.inputs and module.bias is not None:
                score += self._delta(f"{name}.bias", module.bias.detach()).reshape(group.n_nodes, -1).sum(dim=1)
        return score

    def _delta(self, key: str, current: Tensor) -> Tensor:
        before = self.snapshot(key)
        if not isinstance(current, Tensor) or current.shape != before.shape:
            raise ValueError(
                f"{key} changed shape or type since the Primer was created; create the Primer "
                "after any change to the model's structure"
            )
        return (current.to("cpu", torch.float32) - before.float()).abs()
