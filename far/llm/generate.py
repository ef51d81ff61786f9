"""Text from a lean causal LM: greedy or sampled decoding, one token at a time over a KV cache.

The prompt is read once into a `KVCache`; each new token runs the layers on that token alone
(SmolLM2-135M, one thread: 87 ms a token against 305 ms to rerun a 64-token text: docs/llm.md).
Sampling draws from its own `torch.Generator` seeded by `GenerationConfig.seed`.

    >>> ids = generate(model, tokenizer("Once upon a time")["input_ids"], GenerationConfig(max_new_tokens=20))
    >>> tokenizer.decode(ids)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from far.llm.lean_model import LeanCausalLM
from far.training.options import check_float, check_int


@dataclass(frozen=True)
class GenerationConfig:
    """How to pick each next token.

    Args:
        max_new_tokens: Tokens to write at most (fewer when the end-of-text token comes first).
        temperature: 0 for greedy decoding (the most likely token each time); above 0, sample from the
            softmax of logits / temperature.
        top_k: Sample among the k most likely tokens only (None: all).
        top_p: Sample among the fewest most likely tokens whose probabilities reach p (None: all).
        seed: Seed of the sampling generator.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_float("temperature", self.temperature, low=0, hint="0 decodes greedily")
        if self.top_k is not None:
            check_int("top_k", self.top_k, 1, "or None for every token")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_weights(logits: Tensor, config: GenerationConfig) -> Tensor:
    """(vocab,) probabilities to draw the next token from: tempered, then cut to top-k and top-p."""
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.numel():
        kth = torch.topk(logits, config.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1:
        ordered, order = probs.sort(descending=True)
        # Keep a token while the mass before it is below p: the most likely one always stays.
        drop = ordered.cumsum(0) - ordered >= config.top_p
        probs = probs.scatter(0, order[drop], 0.0)
        probs = probs / probs.sum()
    return probs


@torch.no_grad()
def generate(
    model: LeanCausalLM,
    prompt_ids: Sequence[int],
    config: GenerationConfig = GenerationConfig(),
    eos_token_id: int | None = None,
) -> list[int]:
    """The tokens `model` writes after `prompt_ids`, up to `config.max_new_tokens`, ending at (and with) EOS.

    Args:
        model: A lean causal LM (stock, or holding a user's learners file).
        prompt_ids: The prompt's token ids (at least one).
        config: Greedy or sampled decoding.
        eos_token_id: The end-of-text token (None: never stop early).
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt has no tokens; give at least one")
    vocab = model.config.vocab_size
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab})")
    generator = torch.Generator().manual_seed(config.seed)
    cache = model.new_cache()
    step = torch.tensor([list(prompt_ids)])  # (1, T): the whole prompt first, then one token a step
    written: list[int] = []
    for _ in range(config.max_new_tokens):
        logits = model.next_token_logits(step, cache)[0]  # (vocab,)
        if config.greedy:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(sampling_weights(logits, config), 1, generator=generator))
        written.append(token)
        if token == eos_token_id:
            break
        step = torch.tensor([[token]])
    return written
