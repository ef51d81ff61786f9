"""Surgery: rewrite every FFN into learner and frozen sublayers, and merge it back.

Every public verb validates all of its input before it touches the model, so a call that raises
leaves the model exactly as it was. A reconfigured model carries what was done to it as
`model.far_state` (a `FARState`: the config, what FAR froze), which `far.get_config` reads and
`far.restore` removes; it is the one attribute surgery sets.

With `freeze_layers`, the FFNs of the frozen bottom layers are split too, into 0 learners and all
their nodes frozen. Every FFN stays a `SplitLinear`, so the layout records the frozen layers by
itself (their empty learner blocks): learners files, checkpoints and `reconfigure_with_learners`
rebuild them from the learners alone, with no second kind of FFN to tell apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from torch import Tensor, nn

from far.architectures import AttentionSpec, FFNSpec, NodeGroup, check_model, find_attention, find_ffns
from far.config import AUTO, UNSET, FARConfig, as_config
from far.freezing import below_layers, check_depth, depth_parameters, find_layers, layer_index
from far.layers import INPUT, OUTPUT, SplitLinear
from far.priming import Primer, detach_primer, primer_of, trainable_embeddings
from far.selection import auto_freeze_layers, needs_scores, select_learners
from far.surgery.inputs import check_learners, check_scores, primer_head_scores, primer_scores, watching_primer
from far.surgery.portable import check_resettable, reset_values
from far.surgery.state import (
    STATE_ATTRIBUTE,
    FARState,
    is_reconfigured,
    node_groups,
    projection_learners,
)


def reconfigure(
    model: nn.Module,
    config: FARConfig | float = UNSET,
    *,
    scores: Primer | Mapping[str, Tensor] | None = None,
    head_scores: Mapping[str, Tensor] | None = None,
    spec: FFNSpec | None = None,
    attention_spec: AttentionSpec | None = None,
    reset_frozen: bool = True,
    **fields,
) -> nn.Module:
    """Freeze and reconfigure every FFN of `model`, in place, as `config` says.

    Each FFN projection becomes a `SplitLinear`: the learner nodes (the `retention` fraction with
    the largest priming scores) stay trainable, the others are frozen and never get a gradient.
    With `attention_retention`, every attention block is split the same way, a node being a head
    (its query, key and value rows and its output-projection columns). Outputs are unchanged.
    Everything else keeps its `requires_grad`, except the embeddings when `freeze_embeddings=True`,
    and, with `freeze_layers=K`, the bottom K layers and everything below them (the embeddings):
    their FFNs keep no learners, so backward stops at layer K.

    A head split stores learner heads first, so inside the attention the heads are reordered:
    attention maps a model returns with `output_attentions=True` come in that order, and attention
    dropout draws its masks for other heads than the unsplit model would (the same distribution).

    After priming, every frozen node (and frozen head and embedding) goes back to its pre-priming
    value, as the Primer snapshotted it (`reset_frozen=True`): the model is then the stock model
    plus what stays trainable, and `far.save_learners` writes a file for the stock model.

    Args:
        model: A plain model whose architecture is built in (see `far.BUILTIN_SPECS`) or
            described by `spec`.
        config: A `far.FARConfig`; or leave it out and give its fields as keywords (a number here
            is the retention). Defaults: retention 0.4, per-layer selection.
        **fields: The config's fields as keywords: retention, selection, seed, freeze_embeddings,
            recompute_activations, attention_retention, freeze_layers (see `far.FARConfig`).
        scores: `{output_projection_name: (n,) scores}`, or the `far.Primer` that watched this
            model; default: the Primer attached to `model` (the latest created on it). Unused by
            selection="random".
        head_scores: `{attention_output_projection_name: (n_heads,) scores}` for
            `attention_retention`; default: those of the Primer (created with `heads=True`).
        spec: FFN layout for architectures that are not built in.
        attention_spec: Attention layout for architectures that are not built in.
        reset_frozen: Put what FAR freezes back to its pre-priming value, from the Primer passed as
            `scores` or attached to `model` (nothing to do without one). False keeps the primed
            values: a learners file then fits only this primed model.

    Returns:
        The same model object, reconfigured.

    Example:
        >>> primer = far.Primer(model)
        >>> ...  # a few ordinary training steps
        >>> far.reconfigure(model, retention=0.4)  # or far.reconfigure(model, far.FARConfig(0.4))
        >>> far.summary(model)
    """
    config = as_config(config, **fields)
    check_model(model)
    ffns = find_ffns(model, spec)
    blocks = find_attention(model, attention_spec) if config.attention_retention is not None else {}
    if is_reconfigured(model):
        raise ValueError(
            "this model is already reconfigured by FAR; call far.restore(model) before reconfiguring it again"
        )
    layers, layer_of = [], None
    if config.freeze_layers is not None:
        layers = find_layers(model, spec)
        layer_of = layer_index([*ffns, *blocks], layers)
        if config.freeze_layers != AUTO:
            check_depth(config.freeze_layers, len(layers))
    checked = None
    if needs_scores(config):
        checked = check_scores(primer_scores(model, scores, config), ffns)
    ffn_layers = None if layer_of is None else {name: layer_of[name] for name in ffns}
    # "auto" is resolved once, from the FFN scores, so that the heads freeze with the same layers.
    depth = config.freeze_layers
    if depth == AUTO:
        depth = auto_freeze_layers(checked, ffn_layers)
    select_config = dataclasses.replace(config, freeze_layers=depth)
    chosen = select_learners(
        select_config, scores=checked, n_nodes={n: f.n_nodes for n, f in ffns.items()}, layer_of=ffn_layers
    )
    if blocks:
        # Heads are chosen by the same strategy at their own retention, and drawn separately
        # (for "random"), so that adding attention never changes which FFN nodes are learners.
        head_config = dataclasses.replace(select_config, retention=config.attention_retention)
        head_scores_checked = None
        if config.selection != "random":
            head_scores_checked = check_scores(primer_head_scores(model, scores, head_scores), blocks, "head_scores")
        block_layers = None if layer_of is None else {name: layer_of[name] for name in blocks}
        chosen |= select_learners(
            head_config,
            scores=head_scores_checked,
            n_nodes={n: b.n_nodes for n, b in blocks.items()},
            layer_of=block_layers,
        )
    if not isinstance(reset_frozen, bool):
        raise TypeError(f"reset_frozen must be True or False, got {reset_frozen!r}")
    groups = {**ffns, **blocks}
    # The Primer that watched priming holds the pre-priming values; without one nothing was primed.
    primer = None
    if reset_frozen:
        primer = watching_primer(model, scores) if isinstance(scores, Primer) else primer_of(model)
    # Frozen whole besides the split groups' frozen nodes: the embeddings, and with depth the bottom
    # layers' other tensors (attention, norms, biases) and everything below them.
    others = trainable_embeddings(model) if config.freeze_embeddings else []
    if layers:
        covered = {f"{name}.weight" for g in groups.values() for name in g.projections}
        covered |= {f"{name}.bias" for g in groups.values() for name in g.inputs}
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        depth_frozen = [n for n in depth_parameters(model, layers, depth) if n in trainable and n not in covered]
        others += [n for n in depth_frozen if n not in others]
    if primer is not None:
        check_resettable(primer, groups, others)
    _split(model, groups, chosen, config, layers or None, depth or 0)
    if primer is not None:
        reset_values(model, primer, groups, others)
    return model


def reconfigure_with_learners(
    model: nn.Module,
    learners: Mapping[str, Tensor],
    config: FARConfig,
    *,
    spec: FFNSpec | None = None,
    attention_spec: AttentionSpec | None = None,
) -> nn.Module:
    """Reconfigure `model` in place with explicit learner indices (as `far.learners` returns).

    For reloading a recorded layout; `config` is recorded as given (its selection is not rerun).
    With `config.attention_retention` set, `learners` also holds every attention block's learner heads.
    """
    check_model(model)
    if not isinstance(config, FARConfig):
        raise TypeError(f"config must be a far.FARConfig, got {type(config).__name__}")
    groups = node_groups(model, spec, attention=config.attention_retention is not None, attention_spec=attention_spec)
    if is_reconfigured(model):
        raise ValueError("this model is already reconfigured by FAR; call far.restore(model) first")
    checked = check_learners(learners, groups, empty_ok=config.freeze_layers is not None)
    layers, depth = None, 0
    if config.freeze_layers is not None:
        layers = find_layers(model, spec)
        depth = _recorded_depth(checked, layer_index(groups, layers), config, len(layers))
    return _split(model, groups, checked, config, layers, depth)


_SELECTION_FIELDS = ("retention", "selection", "seed", "attention_retention")  # what only picks the learners


def resplit(
    model: nn.Module, learners: Mapping[str, Tensor], config: FARConfig, *, spec: FFNSpec | None = None
) -> bool:
    """Re-split a reconfigured model with other learners, in place, where moving rows is all it takes.

    That is when `config` differs from the model's only in which nodes are learners (retention,
    selection, seed, the attention retention) and the same groups are left without learners (the
    same frozen layers): each projection then permutes its rows within its own storage
    (`SplitLinear.relayout_`), which is what `restore` and `reconfigure_with_learners` would give,
    without building the model twice.

    Returns:
        True if the model now has `learners` and `config`; False if it needs the full way round
        (it is then unchanged).

    Raises:
        ValueError: `learners` do not fit the model (checked before anything changes).
    """
    check_model(model)
    state = getattr(model, STATE_ATTRIBUTE, None)
    if not isinstance(config, FARConfig) or not isinstance(state, FARState) or not is_reconfigured(model):
        return False
    if (state.config.attention_retention is None) != (config.attention_retention is None):
        return False
    fields = (f.name for f in dataclasses.fields(FARConfig))
    if any(getattr(config, f) != getattr(state.config, f) for f in fields if f not in _SELECTION_FIELDS):
        return False
    groups = node_groups(model, spec)
    checked = check_learners(learners, groups, empty_ok=config.freeze_layers is not None)
    modules = {name: model.get_submodule(name) for group in groups.values() for name in group.projections}
    if not all(isinstance(m, SplitLinear) for m in modules.values()):
        return False
    if any((checked[g.name].numel() == 0) != (modules[g.output].n_learners == 0) for g in groups.values()):
        return False  # other layers frozen whole: other parameters change their requires_grad
    for group in groups.values():
        for name in group.projections:
            modules[name].relayout_(projection_learners(model, group, name, checked[group.name]))
    setattr(model, STATE_ATTRIBUTE, dataclasses.replace(state, config=config))
    return True


def _recorded_depth(
    learners: Mapping[str, Tensor], layer_of: Mapping[str, int], config: FARConfig, n_layers: int
) -> int:
    """The frozen layers a layout records: the bottom ones whose groups have no learners."""
    empty = {layer_of[name] for name, idx in learners.items() if idx.numel() == 0}
    depth = next(i for i in range(n_layers + 1) if i not in empty)
    kept = {layer_of[name] for name, idx in learners.items() if idx.numel() > 0}
    if depth >= n_layers or empty - set(range(depth)) or kept & set(range(depth)):
        raise ValueError(
            "learners must leave exactly the bottom frozen layers empty and give every other group at least "
            f"one learner (got empty layers {sorted(empty)} of {n_layers}); pass the learners of a model "
            "reconfigured with this config's freeze_layers"
        )
    if config.freeze_layers not in (AUTO, depth):
        raise ValueError(
            f"the learners leave the bottom {depth} layers empty, but the config says freeze_layers="
            f"{config.freeze_layers!r}; pass the config the learners were chosen with"
        )
    return depth


def _split(
    model: nn.Module,
    groups: Mapping[str, NodeGroup],
    learners: Mapping[str, Tensor],
    config: FARConfig,
    layers: list[str] | None = None,
    depth: int = 0,
) -> nn.Module:
    """Split `groups`; with `layers` (freeze_layers set), freeze the bottom `depth` and all below them."""
    # Everything was validated by the caller; from here on nothing raises on user input.
    depth_frozen: list[str] = []
    if layers is not None:
        # Named before the split: restore gives the plain model's parameters back their requires_grad.
        depth_frozen = [n for n in depth_parameters(model, layers, depth) if model.get_parameter(n).requires_grad]
    for group in groups.values():
        idx = learners[group.name]
        for name in group.inputs:
            rows = projection_learners(model, group, name, idx)
            model.set_submodule(name, SplitLinear.from_linear(model.get_submodule(name), rows, INPUT))
        rows = projection_learners(model, group, group.output, idx)
        # Attention's output projection reads the attention output, not an activation it could rebuild.
        recompute = config.recompute_activations and group.kind == "ffn"
        output = SplitLinear.from_linear(model.get_submodule(group.output), rows, OUTPUT, recompute=recompute)
        model.set_submodule(group.output, output)
    frozen = trainable_embeddings(model) if config.freeze_embeddings else []
    for name in frozen:
        model.get_parameter(name).requires_grad_(False)
    layer_params = []
    if layers is not None:
        below = set(below_layers(model, layers))
        frozen += [n for n in depth_frozen if n in below and n not in frozen]
        layer_params = [n for n in depth_frozen if n not in below]
        # After the split: the frozen layers' learner blocks (empty) freeze with everything else there.
        prefixes = tuple(f"{layer}." for layer in layers[:depth])
        for name, p in model.named_parameters():
            if name in below or name.startswith(prefixes):
                p.requires_grad_(False)
    state = FARState(
        config=config,
        frozen_embeddings=tuple(frozen),
        frozen_layers=depth,
        frozen_parameters=tuple(layer_params),
    )
    setattr(model, STATE_ATTRIBUTE, state)
    detach_primer(model)  # its job is done; its weight snapshot is as large as the FFNs
    return model


def restore(model: nn.Module) -> nn.Module:
    """Merge every split FFN back, in place: an ordinary model again.

    Module types, parameter names, shapes and `state_dict` keys are those of the original model;
    trained learner weights sit in their original rows and columns.

    Returns:
        The same model object.
    """
    check_model(model)
    splits = [(name, m) for name, m in model.named_modules() if isinstance(m, SplitLinear)]
    if not splits:
        raise ValueError(
            "this model was never reconfigured by FAR (it has no split FFN layers); there is nothing to restore"
        )
    for name, module in splits:
        model.set_submodule(name, module.to_linear())
    state = getattr(model, STATE_ATTRIBUTE, None)
    if isinstance(state, FARState):
        for param_name in (*state.frozen_embeddings, *state.frozen_parameters):
            model.get_parameter(param_name).requires_grad_(True)
    if hasattr(model, STATE_ATTRIBUTE):
        delattr(model, STATE_ATTRIBUTE)
    return model


def freeze_ffns(model: nn.Module, spec: FFNSpec | None = None) -> nn.Module:
    """Freeze every FFN projection's weight and bias (an ablation: train attention, norms, heads).

    The model is not rewritten; only `requires_grad` changes. Returns the model.
    """
    check_model(model)
    ffns = find_ffns(model, spec)
    if is_reconfigured(model):
        raise ValueError(
            "this model is reconfigured by FAR; freeze the FFNs of a plain model (far.restore(model) first)"
        )
    for ffn in ffns.values():
        for name in (*ffn.inputs, ffn.output):
            for p in model.get_submodule(name).parameters():
                p.requires_grad_(False)
    return model
