"""The next-token loss over a whole vocabulary without its logits in memory: the vocabulary is read in slices.

The logits are (tokens, vocab): 2,048 tokens of SmolLM2 (vocab 49,152) are 400 MB in fp32, kept by
autograd for backward. Here the tied output embedding is dequantised `VOCAB_SLICE` rows at a time, each
slice's logits folded into a running log-sum-exp, target logit and arg-max, then dropped; backward reads
the slices again and adds (softmax - one-hot) @ slice into the hidden states' gradient.

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
    """Per position: log-sum-exp of the logits, the target's logit and the arg-max token.

    Args:
        hidden: (N, hidden) fp32, the final norm's output.
        targets: (N,) token ids.
        embedding: The tied output embedding, with `rows(ids) -> (len(ids), hidden)` fp32.
        vocab_size: Rows of the embedding.

    Returns:
        lse (N,), target_logit (N,), argmax (N,).
    """
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
        inside = (targets >= start) & (targets < stop)
        rows = inside.nonzero().squeeze(1)
        target_logit[rows] = logits[rows, targets[rows] - start]
    return running_max + running_sum.log(), target_logit, argmax


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
        grad_hidden = torch.zeros_like(hidden)
        for start in range(0, ctx.vocab_size, VOCAB_SLICE):
            stop = min(start + VOCAB_SLICE, ctx.vocab_size)
            rows = ctx.embedding.rows(torch.arange(start, stop))  # (slice, hidden)
            probs = torch.exp(hidden @ rows.t() - lse[:, None])  # (N, slice): softmax, this slice
            inside = ((targets >= start) & (targets < stop)).nonzero().squeeze(1)
            probs[inside, targets[inside] - start] -= 1.0
            grad_hidden.addmm_(probs, rows)
        return grad_hidden * scale, None, None, None


def next_token_loss(hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> Tensor:
    """Mean next-token cross-entropy, differentiable in `hidden` (N, hidden); `targets` (N,)."""
    return _NextTokenLoss.apply(hidden, targets, embedding, vocab_size)


def next_token_counts(hidden: Tensor, targets: Tensor, embedding: nn.Module, vocab_size: int) -> tuple[float, int, int]:
    """Summed negative log-likelihood, correctly predicted tokens (arg-max), and positions: for perplexity."""
    lse, target_logit, argmax = scan_vocabulary(hidden, targets, embedding, vocab_size)
    return float((lse - target_logit).sum()), int((argmax == targets).sum()), int(targets.numel())
