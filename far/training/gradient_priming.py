"""Priming that fits a memory budget: FFN node scores from gradient magnitudes, one layer at a time.

FAR's priming scores each node by how far a short run of ordinary fine-tuning moved it. For an LLM
on a 1 GB budget neither AdamW (two fp32 states per parameter) nor a `far.Primer` snapshot of every
FFN weight fits, and MeZO priming cannot rank nodes: a MeZO update is a scalar times an isotropic
random direction, so every node of a layer moves by the same expected amount.

`gradient_scores` gives each node the L1 norm of its weights' gradient, summed over a few batches:
exactly the L1 distance an SGD step from the pretrained weights would move the node (up to the
learning rate), summed over steps. It keeps no gradient and no snapshot: each FFN weight's
gradient is folded into per-node sums the moment backward produces it, then dropped, and only FFN
weights require grad. With activation checkpointing the backward stores one layer's activations
at a time, so the whole pass peaks a little above inference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from far.architectures import FFNSpec, find_attention, find_ffns
from far.config import UNSET, FARConfig, as_config
from far.freezing import find_layers, layer_index
from far.layers import INPUT, OUTPUT, node_rows
from far.selection import layer_changes
from far.surgery.reconfigure import reconfigure
from far.surgery.state import is_reconfigured
from far.training.memory import to_private_memory
from far.training.recompute import recompute_layers, recomputes_layers


def gradient_scores(
    model: nn.Module,
    batches: Iterable[dict[str, Tensor]],
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor],
    *,
    spec: FFNSpec | None = None,
    checkpointing: bool = True,
    heads: bool = False,
) -> dict[str, Tensor]:
    """Score every FFN node by the L1 norm of its weights' gradients, summed over `batches`.

    The model's weights are not changed; its `requires_grad` flags, train/eval mode and activation
    checkpointing setting are restored afterwards, even if `loss_fn` raises.

    Args:
        model: A plain (not reconfigured) model.
        batches: Batches for `loss_fn`; each costs one forward and one backward.
        loss_fn: `loss_fn(model, batch) -> scalar loss`.
        spec: FFN layout for architectures that are not built in.
        checkpointing: Recompute each layer's activations in the backward (Hugging Face models that
            support it), so the pass needs about one layer's activations instead of all of them.
        heads: Also score every attention head (key/value group under grouped-query attention)
            by its rows of the query, key and value weights and its columns of the output projection.

    Returns:
        `{output_projection_name: (n_nodes,) float32 scores}`, the form `far.reconfigure(scores=...)` takes;
        with `heads`, also one entry per attention block (what `head_scores=` takes).

    Example:
        >>> scores = gradient_scores(model, batches[:8], loss_fn)
        >>> far.reconfigure(model, retention=0.4, scores=scores)
    """
    ffns = {**find_ffns(model, spec), **(find_attention(model) if heads else {})}
    if is_reconfigured(model):
        raise ValueError("this model is already reconfigured by FAR; score the plain model (far.restore(model) first)")
    scores = {name: torch.zeros(ffn.n_nodes, dtype=torch.float32) for name, ffn in ffns.items()}
    # (parameter, FFN name, its projection, the projection's role): weights and input projections' biases
    targets = []
    for ffn in ffns.values():
        for module_name in (*ffn.inputs, ffn.output):
            module = model.get_submodule(module_name)
            role = INPUT if module_name in ffn.inputs else OUTPUT
            biases = (module.bias,) if role == INPUT and module.bias is not None else ()
            targets += [(p, ffn.name, module, role) for p in (module.weight, *biases)]

    def fold(name: str, module: nn.Module, role: str) -> Callable[[Tensor], None]:
        def hook(param: Tensor) -> None:
            grad = param.grad.detach().abs().float()
            # a bias gradient is already one value per row; a weight's is summed over its node rows;
            # an attention node (a head) is several consecutive rows
            per_row = grad if grad.dim() == 1 else node_rows(module, role, grad).sum(dim=1)
            scores[name] += per_row.reshape(scores[name].numel(), -1).sum(dim=1)
            param.grad = None  # never more than one FFN weight's gradient alive

        return hook

    flags = {p: p.requires_grad for p in model.parameters()}
    kept_grads = {p: p.grad for p, *_ in targets}  # a caller's own gradients, put back afterwards
    was_training = model.training
    use_checkpointing = checkpointing and getattr(model, "supports_gradient_checkpointing", False)
    had_checkpointing = use_checkpointing and recomputes_layers(model)
    had_input_hooks = bool(getattr(model, "_require_grads_hooks", None))
    handles = []
    try:
        for p in flags:
            p.requires_grad_(False)
        for p, name, module, role in targets:
            p.grad = None
            p.requires_grad_(True)
            handles.append(p.register_post_accumulate_grad_hook(fold(name, module, role)))
        if use_checkpointing and not had_checkpointing:
            recompute_layers(model, True)
        model.train()  # Hugging Face layers checkpoint only in training mode
        for batch in batches:
            loss_fn(model, batch).backward()
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in flags.items():
            p.requires_grad_(flag)
        for p, grad in kept_grads.items():
            p.grad = grad
        if use_checkpointing and not had_checkpointing:
            recompute_layers(model, False)
            if not had_input_hooks:
                model.disable_input_require_grads()
        model.train(was_training)
    return scores


def ffn_parameter_names(model: nn.Module, spec: FFNSpec | None = None, *, heads: bool = False) -> list[str]:
    """Qualified names of every FFN projection's parameters (weights and biases), and attention's with `heads`."""
    names = []
    for ffn in {**find_ffns(model, spec), **(find_attention(model) if heads else {})}.values():
        for module_name in (*ffn.inputs, ffn.output):
            names += [f"{module_name}.{n}" for n, _ in model.get_submodule(module_name).named_parameters(recurse=False)]
    return names


def split_scores(
    model: nn.Module, scores: dict[str, Tensor], spec: FFNSpec | None, *, heads: bool
) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """`gradient_scores`' scores as the surgery takes them: the FFNs', and the attention blocks' (None without
    `heads`)."""
    ffns = find_ffns(model, spec)
    ffn_scores = {name: s for name, s in scores.items() if name in ffns}
    return ffn_scores, {name: s for name, s in scores.items() if name not in ffns} if heads else None


def prime_and_reconfigure(
    model: nn.Module,
    batches: Iterable[dict[str, Tensor]],
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor],
    config: FARConfig | float = UNSET,
    *,
    spec: FFNSpec | None = None,
    **fields,
) -> dict[str, Tensor] | None:
    """FAR for a memory-bound model: `gradient_scores` priming, then `far.reconfigure`, in place.

    The FFN weights are first moved out of a memory-mapped checkpoint (`to_private_memory`), so
    that the surgery's split copies replace them instead of sitting beside their file pages. Here
    the embeddings are frozen unless the config says otherwise: with MeZO that keeps the largest
    tensor (and the tied LM head) unperturbed, and its unread rows never resident.

    Args:
        model: A plain model; trainable tensors afterwards are the learners and everything outside
            the FFNs (less the embeddings when `freeze_embeddings`).
        batches: Priming batches for `gradient_scores` (unused with selection="random").
        loss_fn: `loss_fn(model, batch) -> scalar loss`.
        config / spec / **fields: As for `far.reconfigure`, except that freeze_embeddings
            defaults to True when the config is given as keywords.

    Returns:
        The priming scores (None for selection="random").
    """
    if not isinstance(config, FARConfig) and fields.get("freeze_embeddings") is None:
        fields["freeze_embeddings"] = True
    config = as_config(config, **fields)
    heads = config.attention_retention is not None
    names = ffn_parameter_names(model, spec, heads=heads)
    if is_reconfigured(model):
        raise ValueError("this model is already reconfigured by FAR; call far.restore(model) first")
    to_private_memory(model, names)
    if config.selection == "random":
        reconfigure(model, config, spec=spec)
        return None
    scores = gradient_scores(model, batches, loss_fn, spec=spec, heads=heads)
    ffn_scores, head_scores = split_scores(model, scores, spec, heads=heads)
    reconfigure(model, config, scores=ffn_scores, head_scores=head_scores, spec=spec)
    return scores


def layer_change_shares(
    model: nn.Module, scores: Mapping[str, Tensor], spec: FFNSpec | None = None
) -> list[float] | None:
    """Each of `model`'s layers' share of the change priming measured (`layer_changes`, summing to 1), rounded to
    4 places; None where the FFNs are outside a numbered stack of layers (no depth to report)."""
    try:
        layer_of = layer_index(scores, find_layers(model, spec))
    except ValueError:
        return None
    change = layer_changes(scores, layer_of)  # (L,)
    return [round(float(share), 4) for share in change / change.sum().clamp(min=1e-30)]
