"""The next-token loss over a whole vocabulary without its logits in memory: the vocabulary is read in slices.

The logits of 2,048 SmolLM2 tokens are 400 MB in fp32, kept by autograd for backward. Here the tied
embedding is dequantised `VOCAB_SLICE` rows at a time into a running log-sum-exp, target logit and
arg-max; backward reads the slices again and adds (softmax - one-hot) @ slice into the hidden gradient.

    >>> loss = next_token_loss(final_hidden, targets, model.embed_tokens)   # mean over positions
    >>> nll_sum, correct, n = next_token_counts(final_hidden, targets, model.embed_tokens)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# Vocabulary rows per slice: (tokens, 4096) fp32 logits and a (4096, hidden) fp32 slice of the embedding.
VOCAB_SLICE = 4096


@torch.no_grad()
def scan_vocabulary(hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> tuple[Tensor, ...]:
    """Per position of `hidden` (N, hidden): the logits' log-sum-exp, the target's logit and the arg-max."""
    n = hidden.shape[0]
    running_max = torch.full((n,), float("-inf"))
    running_sum = torch.zeros(n)
    target_logit = torch.zeros(n)
    best, argmax = torch.full((n,), float("-inf")), torch.zeros(n, dtype=torch.long)
    for start in range(0, vocab_size, VOCAB_SLICE):
        stop = min(start + VOCAB_SLICE, vocab_size)
        logits = hidden @ embedding.rows(torch.arange(start, stop)).t()  # (N, slice)
        slice_max, slice_arg = logits.max(dim=1)
        new_max = torch.maximum(running_max, slice_max)
        running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(logits - new_max[:, None]).sum(1)
        running_max = new_max
        better = slice_max > best
        best = torch.where(better, slice_max, best)
        argmax = torch.where(better, slice_arg + start, argmax)
        inside, column = _in_slice(targets, start, stop)
        target_logit = torch.where(inside, logits.gather(1, column[:, None]).squeeze(1), target_logit)
    return running_max + running_sum.log(), target_logit, argmax


def _in_slice(targets: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor]:
    """Which targets lie in [start, stop), and each one's column there (clamped for the others): masks, not
    indices, so shapes never depend on the data (`torch.export`, `far.device.lm_view`).
    """
    inside = (targets >= start) & (targets < stop)
    return inside, (targets - start).clamp(0, stop - start - 1)


def vocabulary_gradient(hidden: Tensor, targets: Tensor, lse: Tensor, embedding: nn.Module, vocab_size: int) -> Tensor:
    """The gradient of the summed cross-entropy in `hidden`: (softmax - one-hot) @ embedding, in slices."""
    grad_hidden = torch.zeros_like(hidden)
    for start in range(0, vocab_size, VOCAB_SLICE):
        stop = min(start + VOCAB_SLICE, vocab_size)
        rows = embedding.rows(torch.arange(start, stop))  # (slice, hidden)
        probs = torch.exp(hidden @ rows.t() - lse[:, None])  # (N, slice): softmax, this slice
        inside, column = _in_slice(targets, start, stop)
        probs.scatter_add_(1, column[:, None], -inside.to(probs.dtype)[:, None])  # minus the one-hot
        grad_hidden.addmm_(probs, rows)
    return grad_hidden


class _NextTokenLoss(torch.autograd.Function):
    """Mean cross-entropy of `hidden` against `targets` over the embedding's rows, read in slices both ways."""

    @staticmethod
    def forward(ctx, hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> Tensor:
        lse, target_logit, _ = scan_vocabulary(hidden, targets, embedding, vocab_size)
        ctx.save_for_backward(hidden, targets, lse)
        ctx.embedding, ctx.vocab_size = embedding, vocab_size
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        hidden, targets, lse = ctx.saved_tensors
        scale = grad / hidden.shape[0]
        return vocabulary_gradient(hidden, targets, lse, ctx.embedding, ctx.vocab_size) * scale, None, None, None


def next_token_loss(hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> Tensor:
    """Mean next-token cross-entropy, differentiable in `hidden` (N, hidden); `targets` (N,)."""
    return _NextTokenLoss.apply(hidden, targets, embedding, vocab_size)


def next_token_counts(hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> tuple[float, int, int]:
    """Summed negative log-likelihood, correctly predicted tokens (arg-max), and positions: for perplexity."""
    lse, target_logit, argmax = scan_vocabulary(hidden, targets, embedding, vocab_size)
    return float((lse - target_logit).sum()), int((argmax == targets).sum()), int(targets.numel())


def next_token_loss_in_graph(
    hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int
) -> tuple[Tensor, Tensor]:
    """`next_token_loss` without a custom autograd function, for a graph that torch.export differentiates.

    Both vocabulary passes run forward on `hidden` detached, giving the loss and its gradient `g`; the loss
    is returned as `loss + sum(hidden * g) - sum(hidden.detach() * g)`: the same value, with `g` as its
    gradient, so backward reads no vocabulary slice. Returns (mean cross-entropy, arg-max hits).
    """
    fixed = hidden.detach()
    lse, target_logit, argmax = scan_vocabulary(fixed, targets, embedding, vocab_size)
    grad = vocabulary_gradient(fixed, targets, lse, embedding, vocab_size) / hidden.shape[0]
    zero = (hidden * grad).sum() - (fixed * grad).sum()  # exactly 0 (added last, it would round the loss)
    loss = (lse - target_logit).mean() + zero
    return loss, (argmax == targets).sum()
