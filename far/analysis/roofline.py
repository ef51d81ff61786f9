"""A roofline for a training step: matrix-product FLOPs at a calibrated speed, plus the bytes that stream.

    step seconds = Σ_kind FLOPs_kind / F_kind  +  bytes / B  +  mapped bytes / P
                   + dropout elements / R  +  optimizer tensors × t_tensor  +  word-embedding elements × t_embedding

The terms add up rather than overlap: on a small CPU the step is one thread of ops, each a matrix
product (its memory traffic already in F, timed at the step's shapes) or a streaming op. The rates
(`Rates`) are calibrated in the process that runs the step (experiments/calibrate.py); the counts
here are pure functions of the model's shapes (`StepBytes` says what each holds). A trainable word
embedding above the mmap threshold is timed whole per element (`t_embedding`): counted from bytes,
its freshly mapped pages were the terms that missed most. The model and its fit: docs/results.md,
"A roofline for the step: where FAR pays".
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from far.analysis.flops import StepFlops, backward_reach, step_flops
from far.layers import PROJECTION_TYPES, SplitLinear

ADAMW_PASSES = 20  # mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, div 2, add_ 2, addcdiv_ 4 (read or write, fp32)
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest mmap threshold: bigger tensors are mapped (and faulted) afresh
# Elementwise passes (a read or a write of one element) per layer and sequence, over the hidden states
# (T, H), the FFN's activation (T, F) and the attention scores (heads, T, T). Forward, dropout's multiply
# (read, read mask, write) is here; drawing its mask is in the dropout elements.
ACTIVATION_PASSES = {
    # hidden: q and k scaled (2 x 2), heads merged (2), 2 x (dropout 3, residual 3, LayerNorm 2)
    # ffn: GELU 2; scores: mask added 2, softmax 2, dropout 3
    "forward": {"hidden": 22, "ffn": 2, "scores": 7},
    # hidden: 2 x LayerNorm 4, 2 x residual 3, 2 x dropout 3, heads split 2, q and k scaling 4, q+k+v summed 6
    # ffn: GELU 3; scores: dropout 3, softmax 4
    "backward": {"hidden": 32, "ffn": 3, "scores": 7},
}


@dataclass(frozen=True)
class StepBytes:
    """What one training step streams, besides its matrix products."""

    optimizer: int  # AdamW over the trainable tensors
    mapped: int  # tensors above the mmap threshold allocated each step: new pages, faulted
    gradients: int  # zero-filled dense embedding gradients, bias-gradient sums
    activations: int  # elementwise passes forward, and backward where backward reaches
    casts: int  # bf16 autocast: weights to bf16, weight gradients back to fp32
    dropout_elements: int
    optimizer_tensors: int
    embedding_elements: int = 0  # trainable embeddings above the mmap threshold: timed whole (t_embedding)

    @property
    def streamed(self) -> int:
        """Bytes at the streaming bandwidth B (everything but the mapped pages)."""
        return self.optimizer + self.gradients + self.activations + self.casts


@dataclass(frozen=True)
class Rates:
    """Calibrated speeds of one machine at one step shape and precision (see experiments/calibrate.py)."""

    forward_flops_per_s: float  # F of projections' forward products, (tokens, in) x (in, out)
    input_grad_flops_per_s: float  # (tokens, out) x (out, in)
    weight_grad_flops_per_s: float  # (out, tokens) x (tokens, in)
    attention_flops_per_s: float  # batched (T, d) x (d, T) and (T, T) x (T, d)
    bytes_per_s: float  # B: streaming ops (AdamW over layer-sized tensors)
    mapped_bytes_per_s: float  # P: pages of a new tensor above the mmap threshold mapped and faulted
    dropout_elements_per_s: float  # R: dropout mask drawn and applied
    seconds_per_tensor: float  # AdamW's fixed cost per tensor (a dozen small ops)
    seconds_per_embedding_element: float = 0.0  # t_embedding: a word embedding's whole step, per element


def _size(config, *names: str, default: int | float | None = None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is None:
        raise ValueError(f"the model's config has none of {names}; cannot count its activations")
    return default


def step_bytes(model: nn.Module, batch_size: int, seq_len: int, *, bf16: bool = False) -> StepBytes:
    """Bytes streamed by one AdamW training step of `model` at (batch_size, seq_len), fp32 or bf16 autocast.

    Example:
        >>> step_bytes(far.freeze_layers(model, 0), 8, 32).optimizer < step_bytes(model, 8, 32).optimizer
        True
    """
    config = model.config
    hidden = _size(config, "hidden_size")
    ffn = _size(config, "intermediate_size", "hidden_dim", default=4 * hidden)
    heads = _size(config, "num_attention_heads")
    n_layers = _size(config, "num_hidden_layers")
    hidden_p = _size(config, "hidden_dropout_prob", "dropout", default=0.0)
    scores_p = _size(config, "attention_probs_dropout_prob", "attention_dropout", default=0.0)
    tokens = batch_size * seq_len
    per_layer = {"hidden": tokens * hidden, "ffn": tokens * ffn, "scores": batch_size * heads * seq_len * seq_len}

    optimizer = mapped = gradients = casts = tensors = embedding = 0
    timed_whole = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        and m.weight.requires_grad
        and m.weight.numel() * m.weight.element_size() > MMAP_THRESHOLD
    }
    for p in model.parameters():
        if not p.requires_grad:
            continue
        tensors += 1
        if id(p) in timed_whole:
            embedding += p.numel()
            continue
        optimizer += ADAMW_PASSES * p.numel() * p.element_size()
        nbytes = p.numel() * p.element_size()
        mapped += 3 * nbytes if nbytes > MMAP_THRESHOLD else 0  # its gradient, sqrt and quotient
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight.requires_grad and id(module.weight) not in timed_whole:
            # a dense (vocab, hidden) gradient, zero-filled, then each token's row added in
            gradients += module.weight.numel() * module.weight.element_size() + 2 * tokens * module.embedding_dim * 4
        elif isinstance(module, (*PROJECTION_TYPES, SplitLinear)):
            bias = module.learner_bias if isinstance(module, SplitLinear) else module.bias
            if bias is not None and bias.requires_grad:
                gradients += tokens * bias.numel() * 4  # the bias gradient sums (tokens, out)
            if bf16:
                # each forward casts the weights it cannot keep (6 bytes: read fp32, write bf16) ...
                learn = module.learner_weight if isinstance(module, SplitLinear) else module.weight
                cast = learn.numel() if isinstance(module, SplitLinear) else module.weight.numel()
                casts += 6 * cast
                # ... and a trainable weight's bf16 gradient goes back to fp32
                casts += 6 * learn.numel() if learn.requires_grad else 0

    reach = backward_reach(model)
    reached = n_layers if reach is None else n_layers - reach.lowest
    # bf16 autocast: the FFN activation is bf16 (GELU on a bf16 product); norms, softmax, residuals stay fp32.
    element = {"hidden": 4, "ffn": 2 if bf16 else 4, "scores": 4}
    activations = 0
    for part, count in per_layer.items():
        passes = ACTIVATION_PASSES["forward"][part] * n_layers + ACTIVATION_PASSES["backward"][part] * reached
        activations += passes * count * element[part]
    activations += 8 * tokens * hidden * 4  # embeddings: three looked up and summed, LayerNorm
    dropout = n_layers * (2 * per_layer["hidden"] * (hidden_p > 0) + per_layer["scores"] * (scores_p > 0))
    dropout += tokens * hidden * (hidden_p > 0)  # the embeddings' dropout
    return StepBytes(optimizer, mapped, gradients, activations, casts, dropout, tensors, embedding)


def step_terms(flops: StepFlops, traffic: StepBytes, rates: Rates) -> dict[str, float]:
    """Seconds of each roofline term; their sum is the step's roofline time."""
    return {
        "forward_products": (flops.forward - flops.attention_forward) / rates.forward_flops_per_s,
        "input_grad_products": (flops.input_grad - flops.attention_backward) / rates.input_grad_flops_per_s,
        "weight_grad_products": flops.weight_grad / rates.weight_grad_flops_per_s,
        "attention_products": (flops.attention_forward + flops.attention_backward) / rates.attention_flops_per_s,
        "streamed_bytes": traffic.streamed / rates.bytes_per_s,
        "mapped_bytes": traffic.mapped / rates.mapped_bytes_per_s,
        "dropout": traffic.dropout_elements / rates.dropout_elements_per_s,
        "optimizer_tensors": traffic.optimizer_tensors * rates.seconds_per_tensor,
        "embedding": traffic.embedding_elements * rates.seconds_per_embedding_element,
    }


def step_seconds(
    model: nn.Module, batch_size: int, seq_len: int, rates: Rates, *, bf16: bool = False
) -> tuple[float, dict[str, float]]:
    """The roofline's step time and its terms (seconds) for `model` at one shape.

    Example:
        >>> total, terms = step_seconds(model, 8, 32, rates)
        >>> max(terms, key=terms.get)  # what bounds the step
        'forward_products'
    """
    terms = step_terms(step_flops(model, batch_size, seq_len), step_bytes(model, batch_size, seq_len, bf16=bf16), rates)
    return sum(terms.values()), terms
