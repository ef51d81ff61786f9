"""Perplexity and next-token accuracy of a lean causal LM on packed chunks of text.

Perplexity is exp of the mean negative log-likelihood per predicted token (every position of a
chunk but its last predicts the next), over all chunks together, not a mean of per-chunk values;
token accuracy is the share of positions whose arg-max is the next token. Chunks run `batch_size`
at a time; with a `PrefixCache` the frozen bottom's output of each chunk is computed once for the
whole run (the held-out chunks are scored before, during and after training).

    >>> scores = perplexity(model, chunks, batch_size=8)
    >>> scores["perplexity"], scores["token_accuracy"]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from far.llm.lean_model import LeanCausalLM
from far.llm.prefix import PrefixCache


@torch.no_grad()
def perplexity(model: LeanCausalLM, chunks: Tensor, batch_size: int, bottom: PrefixCache | None = None) -> dict:
    """{"perplexity", "token_accuracy", "loss" (mean NLL, nats), "tokens" (predicted positions)} of `chunks`.

    Args:
        model: The model, as it is now (perturbation cleared).
        chunks: (n, T) token ids, no padding.
        batch_size: Chunks per forward pass.
        bottom: The frozen bottom's states, kept per chunk (its model must be `model`).
    """
    if len(chunks) == 0:
        raise ValueError("there are no chunks to score")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if bottom is not None and bottom.model is not model:
        raise ValueError("the PrefixCache belongs to another model")
    nll, correct, tokens = 0.0, 0, 0
    for start in range(0, len(chunks), batch_size):
        ids = chunks[start : start + batch_size]
        if bottom is not None and bottom.n_layers:
            states = bottom.hidden(ids, torch.ones_like(ids))
            counts = model.next_token_counts(ids, start=states, start_layer=bottom.n_layers)
        else:
            counts = model.next_token_counts(ids)
        nll, correct, tokens = nll + counts[0], correct + counts[1], tokens + counts[2]
    loss = nll / tokens
    return {"perplexity": math.exp(loss), "token_accuracy": correct / tokens, "loss": loss, "tokens": tokens}
