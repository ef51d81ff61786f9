"""generate.pte: greedy decoding of a causal LM export on the device, a token a call over a KV cache in the program.

    forward(token (1, 1) int64, position (1,) int64, *trained) -> logits (1, vocab) float32

The program holds the model's frozen tensors as the training programs hold them (bf16 matrices, the Q8_0 or dense
embedding, read into fp32 as each layer runs) and, per layer, the keys and values of every position read so far as
mutable buffers of `cache_length` positions (fp32, (1, kv_heads, cache_length, head_dim)): a call writes its token's
keys and values at `position` and attends to positions 0..position (a sliding layer: to its window). The trained
tensors are inputs, in the manifest's `trainable` order and named as the state names them, so a runner passes the
state's tensors as they are: generation after training uses what was trained. A prompt is read a token a call
(positions 0, 1, ...), then each greedy token is fed back (`greedy_ids` here, `far_generate` on the device).

The layers are the lean model's own (`far.device.lm_view.decoding_twins`); only the attention's cache differs.

    >>> decoder = LMDecoder(model, cache_length=256)
    >>> program = generation_program(decoder, names)   # names: the manifest's trainable tensors, in order
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from far.device.lm_view import EagerAttention, decoding_twins
from far.device.lowering import forward_program, quietly
from far.llm.compact import CompactLinear
from far.llm.lean_config import LeanConfig
from far.llm.lean_model import LeanCausalLM, tied_logits

GENERATE_INPUTS = ("token", "position")  # then the trained tensors
CACHE = ("cache_keys_", "cache_values_")  # the cache's buffers, in the graph's names (b_decoder_cache_keys_0)


class StaticKVCache(nn.Module):
    """Each layer's keys and values at `length` positions: buffers the program updates in place."""

    def __init__(self, config: LeanConfig, length: int) -> None:
        super().__init__()
        shape = (1, config.num_kv_heads, length, config.head_dim)
        for i in range(config.num_layers):
            self.register_buffer(f"keys_{i}", torch.zeros(shape))
            self.register_buffer(f"values_{i}", torch.zeros(shape))
        self.length = length


@dataclass
class CacheAt:
    """A `StaticKVCache` read at one position (1,): what `CachedAttention` writes to and which keys it sees."""

    cache: StaticKVCache
    position: Tensor

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store one token's (1, kv_heads, 1, head_dim) keys and values at the position; returns all positions'."""
        keys, values = getattr(self.cache, f"keys_{layer}"), getattr(self.cache, f"values_{layer}")
        keys[:, :, self.position] = k
        values[:, :, self.position] = v
        return keys, values

    def mask(self, window: int | None) -> Tensor:
        """(length,) bool: the keys the position's query sees (causal; within `window` for a sliding layer)."""
        slots = torch.arange(self.cache.length)
        seen = slots <= self.position
        return seen if window is None else seen & (self.position - slots < window)


class DecodingLinear(CompactLinear):
    """A `CompactLinear` for a few tokens as `W @ x^T`: ExecuTorch's `linear` copies its weight transposed on every
    call (a step of six SmolLM2-wide layers took 133 ms that way, 56 ms this way). Blocks of output rows multiply
    one by one (no concatenated copy); blocks of input columns are concatenated, as the lean runtime multiplies them.
    """

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1]).t()  # (in, T)
        if self.node_dim == 0:
            y = torch.cat([part.value() @ rows for part in self.parts], dim=0)  # (out, T)
        else:
            y = self.weight_value() @ rows  # blocks of input columns: one product, as the lean runtime's
        return y.t().reshape(*x.shape[:-1], -1)


class CachedAttention(EagerAttention):
    """The lean attention on one token at a position, its keys and values kept in a `StaticKVCache`."""

    def forward(self, x: Tensor, cache: CacheAt) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.project(x, cache.position)
        keys, values = cache.write(self.layer, k, v)  # (1, kv_heads, length, head_dim)
        out = self.attend(q, keys, values, cache.mask(self.config.sliding_window if self.sliding else None))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class LMDecoder(nn.Module):
    """A lean causal LM as one decoding step: (token (1, 1), position (1,)) -> logits (1, vocab)."""

    def __init__(self, model: LeanCausalLM, cache_length: int) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm = decoding_twins(model, CachedAttention, DecodingLinear)
        self.cache = StaticKVCache(model.config, cache_length)
        self.embed_scale, self.vocab_size = model.embed_scale, model.config.vocab_size

    def forward(self, token: Tensor, position: Tensor) -> Tensor:
        h = self.embed_tokens.rows(token)  # (1, 1, hidden), as LeanCausalLM.embed
        h = h * self.embed_scale if self.embed_scale != 1.0 else h
        at = CacheAt(self.cache, position)
        for layer in self.layers:
            h = layer(h, at)
        return tied_logits(self.norm(h[:, -1]), self.embed_tokens, self.vocab_size)

    def trained(self) -> dict[str, Tensor]:
        """The trained tensors by name (the lean model's names, as the state's)."""
        return {n: p for n, p in self.named_parameters() if p.requires_grad}


class _TrainedAsInputs(nn.Module):
    """`decoder` with its trained tensors taken as inputs after (token, position), in `names`' order."""

    def __init__(self, decoder: LMDecoder, names: Sequence[str]) -> None:
        super().__init__()
        self.decoder, self.names = decoder, list(names)

    def forward(self, token: Tensor, position: Tensor, *trained: Tensor) -> Tensor:
        return torch.func.functional_call(self.decoder, dict(zip(self.names, trained, strict=True)), (token, position))


def check_cache_length(cache_length: object) -> int:
    """`cache_length` as the positions a generate program keeps, or a ValueError saying what it takes."""
    if isinstance(cache_length, bool) or not isinstance(cache_length, int) or not 2 <= cache_length <= 1 << 16:
        raise ValueError(
            f"the generate program's cache length is the prompt and the written tokens together, 2 to 65536 "
            f"positions; got {cache_length!r}"
        )
    return cache_length


def generation_program(decoder: LMDecoder, names: Sequence[str]):
    """The ExecuTorch program of one decoding step of `decoder`, its trained tensors inputs in `names`' order.

    Raises:
        ValueError: `names` are not the decoder's trained tensors.
    """
    trained = decoder.trained()
    if sorted(trained) != sorted(names):
        raise ValueError(
            f"the generate program would take other trained tensors than the training program: only in the decoder "
            f"{sorted(set(trained) - set(names))[:3]}, only in the training program "
            f"{sorted(set(names) - set(trained))[:3]}"
        )
    inputs = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), *(trained[n] for n in names))
    with quietly(), warnings.catch_warnings():  # torch.export's and executorch's notes on their own internals
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        # The trained tensors are read where the runner keeps them (the state file): no copy into planned memory.
        # The cache starts as zeros, serialized: a masked position's value still meets a zero weight (0 * NaN).
        return forward_program(
            _TrainedAsInputs(decoder, names), inputs, xnnpack=False, planned_inputs=False, initialized_buffers=CACHE
        )


@torch.no_grad()
def greedy_ids(
    step, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None, cache_length: int
) -> list[int]:
    """The greedy tokens after `prompt_ids` from `step(token (1, 1), position (1,)) -> logits (1, vocab)`, a
    generate program's call (or an `LMDecoder`'s): the prompt a token a call, then each written token fed back;
    ending at (and with) EOS, as `far.llm.generate.generate` writes them.

    Raises:
        ValueError: an empty prompt, or one that with the tokens to write does not fit the cache.
    """
    if not prompt_ids:
        raise ValueError("the prompt has no tokens; give at least one")
    needed = len(prompt_ids) + max_new_tokens - 1  # the last token written is never fed back
    if needed > cache_length:
        raise ValueError(
            f"{len(prompt_ids)} prompt tokens and {max_new_tokens} new ones need {needed} positions; the generate "
            f"program keeps {cache_length}: shorten them, or export with a longer cache (far export --generate N)"
        )
    written: list[int] = []
    feed = list(prompt_ids)
    for position in range(len(prompt_ids) + max_new_tokens - 1):
        token = feed[position] if position < len(feed) else written[-1]
        logits = step(torch.tensor([[token]]), torch.tensor([position]))
        if position >= len(prompt_ids) - 1:
            written.append(int(logits[0].argmax()))
            if written[-1] == eos_token_id:
                break
    return written
