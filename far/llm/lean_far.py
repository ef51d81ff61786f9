"""FAR on the lean runtime: gradient priming, learner selection, and each FFN split into two blocks.

Each FFN projection gets two `CompactWeight` blocks along the node axis, learners first (trainable), the
frozen nodes (bf16) after; the permutation is the same for an FFN's three projections, so the outputs are
unchanged. Scores are each node's L1 weight-gradient norm, folded in as backward produces them.

    >>> scores = gradient_scores(model, batches, loss_fn)
    >>> split_ffns(model, select_learners(FARConfig(0.4), scores=scores))
    >>> set_trainable(model, "learners")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from far.config import FARConfig
from far.llm.compact import CompactLinear, CompactWeight
from far.llm.lean_model import LeanCausalLM
from far.selection import select_learners

OUTPUT = "down_proj"
# Each FFN projection's node axis: an input projection's nodes are its rows, the output projection's its columns.
NODE_DIM = {"gate_proj": 0, "up_proj": 0, "down_proj": 1}
# What of the FFNs trains: every weight, the learner blocks of split FFNs, or nothing.
FFN_TRAINING = ("all", "learners", "none")
# MeZO + FAR freezes this share of the bottom layers unless told otherwise: a zeroth-order step then perturbs
# (and its two passes run) only the layers above, whose input is computed once per prompt (far.llm.prefix).
# Measured on few-shot SST-2 against plain MeZO on the clock: experiments/llm_fewshot_time.py.
ZO_FROZEN_FRACTION = 2 / 3
# ... and keeps this share of all FFN nodes as learners (0.3 of the nodes in the layers above), unless --retention.
ZO_RETENTION = 0.1


@dataclass(frozen=True)
class Layout:
    """What trains: FAR's config (None: no surgery), the FFN part ("all", "learners", "none"), the frozen bottom."""

    far: FARConfig | None
    ffn: str
    frozen_layers: int
    dtype: torch.dtype


def zeroth_order_depth(n_layers: int) -> int:
    """The bottom layers MeZO + FAR freezes by default: `ZO_FROZEN_FRACTION` of them, one layer left at least."""
    return min(n_layers - 1, round(ZO_FROZEN_FRACTION * n_layers))


def lean_layout(
    config: FARConfig | None,
    n_layers: int,
    dtype: torch.dtype,
    *,
    ffn: str,
    frozen_layers: int | None,
    retention_given: bool,
) -> Layout:
    """What trains on the lean runtime, decided before the model is split.

    FAR without a depth is MeZO + FAR's default: `zeroth_order_depth(n_layers)` bottom layers frozen whole
    and `ZO_RETENTION` of all FFN nodes as learners (unless a retention was given).
    """
    if config is None:
        return Layout(None, ffn, int(frozen_layers or 0), dtype)
    if config.freeze_layers is None:
        retention = config.retention if retention_given else ZO_RETENTION
        config = dataclasses.replace(config, freeze_layers=zeroth_order_depth(n_layers), retention=retention)
    depth = config.freeze_layers if isinstance(config.freeze_layers, int) else 0
    return Layout(config, "learners", depth, dtype)


def ffn_names(model: LeanCausalLM) -> list[str]:
    """Each FFN's name, as FAR names an FFN: its output projection (`layers.3.mlp.down_proj`)."""
    return [f"layers.{i}.mlp.{OUTPUT}" for i in range(len(model.layers))]


def ffn_of(key: str) -> str:
    """The name of the FFN that a projection's key (`layers.3.mlp.up_proj.learner_weight`) belongs to."""
    return f"{key.split('.mlp.')[0]}.mlp.{OUTPUT}"


def gradient_scores(
    model: LeanCausalLM,
    batches: Iterable[dict[str, Tensor]],
    loss_fn: Callable[[LeanCausalLM, dict[str, Tensor]], Tensor],
) -> dict[str, Tensor]:
    """Each FFN node's summed L1 weight-gradient norm over `batches`: `{ffn name: (n_nodes,) fp32}`."""
    scores = {name: torch.zeros(model.config.intermediate_size) for name in ffn_names(model)}

    def sink(name: str, node_dim: int) -> Callable[[Tensor], None]:
        def fold(grad: Tensor) -> None:  # grad: (out, in); nodes are rows (inputs) or columns (output)
            scores[name] += grad.abs().sum(dim=1 - node_dim)

        return fold

    layers = []
    for i, layer in enumerate(model.layers):
        for proj, node_dim in NODE_DIM.items():
            linear = getattr(layer.mlp, proj)
            linear.grad_sink = sink(f"layers.{i}.mlp.{OUTPUT}", node_dim)
            layers.append(linear)
    try:
        with torch.enable_grad(), model.input_gradients():
            for batch in batches:
                loss_fn(model, batch).backward()
    finally:
        for linear in layers:
            linear.grad_sink = None
    return scores


def magnitude_scores(model: LeanCausalLM) -> dict[str, Tensor]:
    """Each FFN node scored for zeroth-order training: minus the mean |weight| of its rows and column.

    Sparse-MeZO (Liu et al., 2024) perturbs only small weights: the large ones are where a zeroth-order
    step's noise does the most damage. Whole nodes keep FAR's split contiguous; no data, no backward.
    """
    scores = {}
    for name, layer in zip(ffn_names(model), model.layers, strict=True):
        total = torch.zeros(model.config.intermediate_size)
        for proj, node_dim in NODE_DIM.items():
            linear = getattr(layer.mlp, proj)
            if len(linear.parts) != 1:
                raise ValueError(f"{name} is already split; score the model before split_ffns")
            total += linear.parts[0].stored.float().abs().mean(dim=1 - node_dim)
        scores[name] = -total
    return scores


SCORINGS = ("gradient", "magnitude")


def _block(weight: Tensor, nodes: Tensor, node_dim: int, dtype: torch.dtype, trainable: bool, model) -> CompactWeight:
    return CompactWeight(weight.index_select(node_dim, nodes), dtype, trainable, model.perturbation)


def split_ffns(
    model: LeanCausalLM, learners: Mapping[str, Tensor], learner_dtype: torch.dtype = torch.float32
) -> LeanCausalLM:
    """Split every FFN into learners (first, stored in `learner_dtype`) and frozen nodes (bf16), in place.

    Args:
        learners: `{ffn name: sorted node indices}`, as `far.selection.select_learners` returns.
        learner_dtype: fp32 (exact MeZO updates) or bf16 (stochastic rounding).

    Raises:
        ValueError: an FFN is missing from `learners`, already split, or an index is out of range.
    """
    names, n = ffn_names(model), model.config.intermediate_size
    for name, layer in zip(names, model.layers, strict=True):  # check everything before changing anything
        idx = learners.get(name)
        if idx is None:
            raise ValueError(f"no learners given for {name}; give one index tensor per FFN ({len(names)})")
        if len(layer.mlp.down_proj.parts) != 1:
            raise ValueError(f"{name} is already split")
        if idx.numel() and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"learner indices of {name} must lie in [0, {n})")
    for name, layer in zip(names, model.layers, strict=True):
        idx = learners[name].long().sort().values
        keep = torch.ones(n, dtype=torch.bool)
        keep[idx] = False
        frozen = keep.nonzero().squeeze(1)
        for proj, node_dim in NODE_DIM.items():
            old = getattr(layer.mlp, proj).parts[0].stored
            parts = [
                _block(old, idx, node_dim, learner_dtype, True, model),
                _block(old, frozen, node_dim, torch.bfloat16, False, model),
            ]
            setattr(layer.mlp, proj, CompactLinear(parts, node_dim))
            del old
        layer.mlp.learner_nodes = idx  # the layout, for saving what was trained (`far.llm.lean_saving`)
    model.index_weights()
    return model


def set_trainable(model: LeanCausalLM, ffn: str, dtype: torch.dtype = torch.float32, frozen_layers: int = 0) -> int:
    """Mark what MeZO trains, and store it in `dtype`; the embedding (and tied head) stays frozen.

    Args:
        ffn: "all" (every weight but the embedding), "learners" (split FFNs' learner blocks: FAR) or "none",
            beside everything outside the FFNs.
        frozen_layers: The bottom layers frozen whole, so that their output is computed once per prompt.

    Returns:
        The number of trainable values.
    """
    if ffn not in FFN_TRAINING:
        raise ValueError(f"ffn must be one of {', '.join(FFN_TRAINING)}, got {ffn!r}")
    n_layers = len(model.layers)
    if isinstance(frozen_layers, bool) or not isinstance(frozen_layers, int) or not 0 <= frozen_layers < n_layers:
        raise ValueError(
            f"frozen_layers must be an int in [0, {n_layers - 1}] (one layer left to train), got {frozen_layers!r}"
        )
    split = any(len(layer.mlp.down_proj.parts) == 2 for layer in model.layers)
    if ffn == "learners" and not split:
        raise ValueError("ffn='learners' needs split FFNs: run split_ffns (after gradient_scores) first")
    ffn_weights = {id(w) for layer in model.layers for w in layer.mlp.modules() if isinstance(w, CompactWeight)}
    learner_blocks = {id(getattr(layer.mlp, p).parts[0]) for layer in model.layers for p in NODE_DIM}
    below = {id(w) for layer in model.layers[:frozen_layers] for w in layer.modules() if isinstance(w, CompactWeight)}
    for weight in model.compact_weights():
        in_ffn = id(weight) in ffn_weights
        trainable = not in_ffn or ffn == "all" or (ffn == "learners" and id(weight) in learner_blocks and split)
        weight.trainable = trainable and id(weight) not in below
        if weight.trainable and weight.stored.dim() >= 2 and weight.stored.dtype != dtype:
            weight.stored = torch.nn.Parameter(weight.stored.detach().to(dtype), requires_grad=False)
    return model.num_parameters(trainable_only=True)


def frozen_bottom(learners: Mapping[str, Tensor], names: list[str]) -> int:
    """How many bottom FFNs (in `names`' order, one a layer) `learners` leaves without a learner."""
    return next((i for i, name in enumerate(names) if learners[name].numel()), len(names))


def prime_and_split(
    model: LeanCausalLM,
    batches: Iterable[dict[str, Tensor]],
    loss_fn: Callable[[LeanCausalLM, dict[str, Tensor]], Tensor],
    config: FARConfig,
    learner_dtype: torch.dtype = torch.float32,
    scoring: str = "gradient",
) -> dict[str, Tensor] | None:
    """FAR on a lean model: node scores (unless selection is random), selection, split, in place.

    `scoring`: "gradient" (priming on `batches`) or "magnitude" (`magnitude_scores`, `batches` unread).
    Returns the scores (None for random selection).
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    n_nodes = {name: model.config.intermediate_size for name in ffn_names(model)}
    if config.selection == "random":
        scores = None
    elif scoring == "magnitude":
        scores = magnitude_scores(model)
    else:
        scores = gradient_scores(model, batches, loss_fn)
    chosen = select_learners(config, scores=scores, n_nodes=n_nodes)
    split_ffns(model, chosen, learner_dtype)
    # With `config.freeze_layers`, the bottom layers have no learners: freeze them whole.
    frozen = frozen_bottom(chosen, ffn_names(model)) if config.freeze_layers is not None else 0
    set_trainable(model, "learners", learner_dtype, frozen_layers=frozen)
    return scores


def apply_layout(
    model: LeanCausalLM,
    layout: Layout,
    batches: Iterable[dict[str, Tensor]] | Iterable[Tensor],
    loss_fn: Callable[[LeanCausalLM, object], Tensor],
) -> None:
    """Give `model` the layout in place: FAR primed on `batches` and split, else the FFN part and frozen bottom."""
    if layout.far is not None:
        prime_and_split(model, batches, loss_fn, layout.far, layout.dtype)
    else:
        set_trainable(model, layout.ffn, layout.dtype, frozen_layers=layout.frozen_layers)
