"""A small Llama / Gemma-3 decoder in plain torch, weights in compact storage (`far.llm.compact`), fp32 compute.

A prompt classifier needs only the label words' logits at each prompt's last token (`label_logits`);
a fine-tune on text the next-token loss over the vocabulary in slices (`next_token_loss`); generation
the last token's logits over a `KVCache` (`next_token_logits`). Module names follow transformers', so a
transformers state dict loads by name (`from_state_dict`): the parity tests compare the two.

    >>> model = from_state_dict(config, hf_model.state_dict())
    >>> model.label_logits(input_ids, attention_mask, label_ids)   # (batch, n_labels)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from far.llm.compact import CompactLinear, CompactWeight, DenseEmbedding, Perturbation, Q8Embedding
from far.llm.gguf_source import GGUFSource
from far.llm.lean_config import SLIDING, LeanConfig
from far.llm.next_token import VOCAB_SLICE, next_token_counts, next_token_loss
from far.llm.recompute import Recompute

TensorSource = Callable[[str], Tensor]  # transformers-style name -> fp32 (or any float) tensor


class RMSNorm(nn.Module):
    """RMSNorm in fp32; Gemma's scales by (1 + w), Llama's by w."""

    def __init__(self, weight: CompactWeight, eps: float, gemma: bool) -> None:
        super().__init__()
        self.weight, self.eps, self.gemma = weight, eps, gemma

    def forward(self, x: Tensor) -> Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight.value()
        return normed * (1.0 + w) if self.gemma else normed * w


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (T, head_dim) for transformers' half-split rotary layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


class KVCache:
    """The keys and values of the tokens a model has read, per layer, for decoding one token at a time."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    def seen(self, layer: int) -> int:
        """Tokens whose keys `layer` holds."""
        keys = self.keys[layer]
        return 0 if keys is None else keys.shape[2]

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, kv_heads, t, head_dim) keys and values to `layer`'s; returns all of them."""
        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, config: LeanConfig, layer: int, linear: Callable[[str], CompactLinear], norm) -> None:
        super().__init__()
        self.config, self.sliding = config, config.layer_types[layer] == SLIDING
        self.layer = layer  # its slot in a KVCache
        self.theta = config.rope_local_theta if self.sliding else config.rope_theta
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, linear(name))
        if config.is_gemma:
            self.q_norm, self.k_norm = norm("q_norm"), norm("k_norm")

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, heads, T, head_dim), keys and values (B, kv_heads, T, head_dim) of `x` (B, T, hidden) at
        `positions` (T,), rotated.
        """
        c = self.config
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(b, t, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if c.is_gemma:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, heads, T, head_dim)
        cos, sin = rotary(positions, c.head_dim, self.theta)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        c = self.config
        b, t, _ = x.shape
        start = 0 if cache is None else cache.seen(self.layer)  # x's first position
        q, k, v = self.project(x, torch.arange(start, start + t))
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)  # (B, kv_heads, start + t, head_dim)
        # Rows are padded on the right, so under a causal mask a real token never sees padding.
        # Queries at start.., keys from 0: SDPA's is_causal would align them top-left, so a cache needs a mask.
        mask, window = None, c.sliding_window if self.sliding else None
        if start or (window is not None and t > window):
            i, j = torch.arange(start, start + t)[:, None], torch.arange(start + t)[None, :]
            mask = j <= i
            if window is not None:
                mask = mask & (i - j < window)
        out = self.attend(q, k, v, mask)  # (B, heads, T, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c.num_heads * c.head_dim))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q k^T * scale) v over the keys `mask` allows (None: causally, aligned at the first token)."""
        scale = self.config.query_scale
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)); FAR splits its nodes (`far.llm.lean_far`)."""

    def __init__(self, config: LeanConfig, linear: Callable[[str], CompactLinear]) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear("gate_proj"), linear("up_proj"), linear("down_proj")
        self.gemma = config.is_gemma
        self.learner_nodes: Tensor | None = None  # once FAR has split it: the original indices of the learners

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.gemma else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LeanConfig, layer: int, source: _Builder) -> None:
        super().__init__()
        prefix = f"model.layers.{layer}"
        norm = lambda name: source.norm(f"{prefix}.{name}")  # noqa: E731
        self.gemma = config.is_gemma
        self.input_layernorm = norm("input_layernorm")
        self.self_attn = Attention(
            config,
            layer,
            lambda n: source.linear(f"{prefix}.self_attn.{n}"),
            lambda n: source.norm(f"{prefix}.self_attn.{n}"),
        )
        self.post_attention_layernorm = norm("post_attention_layernorm")
        if self.gemma:
            self.pre_feedforward_layernorm = norm("pre_feedforward_layernorm")
            self.post_feedforward_layernorm = norm("post_feedforward_layernorm")
        self.mlp = MLP(config, lambda n: source.linear(f"{prefix}.mlp.{n}"))

    def forward(self, h: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.gemma:
            h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cache))
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = h + self.self_attn(self.input_layernorm(h), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Builder:
    """Turns named source tensors into compact modules, one tensor at a time."""

    def __init__(self, config: LeanConfig, tensors: TensorSource, dtype: torch.dtype, perturbation: Perturbation):
        self.config, self.tensors, self.dtype, self.perturbation = config, tensors, dtype, perturbation

    def linear(self, name: str) -> CompactLinear:
        weight = CompactWeight(self.tensors(f"{name}.weight"), self.dtype, False, self.perturbation)
        return CompactLinear([weight])

    def norm(self, name: str) -> RMSNorm:
        # Norm weights stay fp32: a few thousand values, and MeZO may train them.
        weight = CompactWeight(self.tensors(f"{name}.weight"), torch.float32, False, self.perturbation)
        return RMSNorm(weight, self.config.rms_eps, self.config.is_gemma)


def tied_logits(last: Tensor, embedding: nn.Module, vocab_size: int) -> Tensor:
    """Logits over the vocabulary (B, vocab) of final-norm outputs `last` (B, hidden), by the tied embedding."""
    # The tied head dequantised a slice at a time: whole, it would be an fp32 copy of the embedding
    # (113 MB for SmolLM2, 671 MB for Gemma-3-270M); in slices it is also faster (cache-sized).
    slices = range(0, vocab_size, VOCAB_SLICE)
    rows = (embedding.rows(torch.arange(s, min(s + VOCAB_SLICE, vocab_size))) for s in slices)
    return torch.cat([last @ r.t() for r in rows], dim=1)


class LeanCausalLM(nn.Module):
    """A decoder whose every weight is a `CompactWeight`.

    Args:
        config: The model's `LeanConfig`.
        embed_tokens: A frozen `Q8Embedding` or `DenseEmbedding` (also the tied LM head).
        tensors: Every other weight by transformers name (`model.layers.0.mlp.up_proj.weight`, ...).
        dtype: Storage dtype of the matrices.
    """

    def __init__(
        self,
        config: LeanConfig,
        embed_tokens: nn.Module,
        tensors: TensorSource,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self.config = config
        self.perturbation = Perturbation()
        self.embed_tokens = embed_tokens
        source = _Builder(config, tensors, dtype, self.perturbation)
        self.layers = nn.ModuleList(DecoderLayer(config, i, source) for i in range(config.num_layers))
        self.norm = source.norm("model.norm")
        self.embed_scale = config.hidden_size**0.5 if config.is_gemma else 1.0
        self._input_grad = False
        # The GGUF file the weights were read from (`far.llm.gguf_file`), which a learners file is checked against.
        self.source: GGUFSource | None = None
        self.released_layers = 0  # the bottom layers whose weights `release_bottom` freed
        self._released_values = 0
        self.index_weights()

    def index_weights(self) -> None:
        """Number every `CompactWeight` in module order: its direction's seed is (step seed, index)."""
        for i, weight in enumerate(self.compact_weights()):
            weight.index = i

    def compact_weights(self) -> Iterator[CompactWeight]:
        return (m for m in self.modules() if isinstance(m, CompactWeight))

    def trainable_weights(self) -> list[CompactWeight]:
        return [w for w in self.compact_weights() if w.trainable]

    def num_parameters(self, trainable_only: bool = False) -> int:
        if trainable_only:
            return sum(w.stored.numel() for w in self.trainable_weights())
        embedding = sum(t.numel() for t in self.embed_tokens.parameters()) or (
            self.config.vocab_size * self.config.hidden_size
        )
        return embedding + self._released_values + sum(w.stored.numel() for w in self.compact_weights())

    def release_bottom(self, n_layers: int) -> int:
        """Free the weights of layers 0..n_layers-1, whose output a run has kept for every input it reads
        (`PrefixCache.prefill`); returns the bytes freed. Modules and indices stay (MeZO seeds directions by
        index); running a released layer raises. ValueError if one holds a trainable weight.
        """
        if n_layers > self.lowest_trainable_layer():
            raise ValueError(
                f"layer {self.lowest_trainable_layer()} holds a trainable weight: only frozen layers can be released"
            )
        freed = 0
        for layer in self.layers[self.released_layers : n_layers]:
            for weight in layer.modules():
                if isinstance(weight, CompactWeight):
                    freed += weight.stored.nbytes
                    self._released_values += weight.stored.numel()
                    weight.stored = nn.Parameter(weight.stored.new_empty(0), requires_grad=False)
        self.released_layers = max(self.released_layers, n_layers)
        return freed

    @contextlib.contextmanager
    def input_gradients(self) -> Iterator[None]:
        """Within the block, forwards build an autograd graph from the embeddings on, checkpointed per layer."""
        self._input_grad = True
        try:
            yield
        finally:
            self._input_grad = False

    def embed(self, input_ids: Tensor) -> Tensor:
        """The token embeddings the first layer reads: (B, T, hidden)."""
        h = self.embed_tokens.rows(input_ids)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def run_layers(self, h: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """Layers `start` to `stop` (exclusive; default: the last) applied to `h`, the input of layer `start`."""
        self._check_not_released(start)
        layers = self.layers[start:stop]
        if self._input_grad and torch.is_grad_enabled():
            h.requires_grad_(True)
            # Keep only each layer's input for backward and recompute the layer there: the graph
            # of all layers at once would hold every activation of every layer
            # (docs/design.md, "Resident memory").
            for layer in layers:
                h = Recompute.apply(layer, h)
            return h
        for layer in layers:
            h = layer(h)
        return h

    def _check_not_released(self, start: int) -> None:
        if start < self.released_layers:
            raise RuntimeError(
                f"layers 0..{self.released_layers - 1} of this model were released (release_bottom) after their "
                f"output was kept: read it from the PrefixCache that kept it, or load the model again"
            )

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        """The last layer's output before the final norm: (B, T, hidden)."""
        return self.run_layers(self.embed(input_ids))

    def answer_logits(self, h: Tensor, attention_mask: Tensor, label_ids: Tensor) -> Tensor:
        """The label words' logits from the last layer's output `h` at each right-padded row's last token."""
        last = attention_mask.sum(dim=1) - 1
        answer = self.norm(h[torch.arange(h.shape[0]), last])  # (B, hidden): the norm is per position
        return answer @ self.embed_tokens.rows(label_ids).t()

    def label_logits(self, input_ids: Tensor, attention_mask: Tensor, label_ids: Tensor) -> Tensor:
        """The label words' logits at each right-padded row's last token: (B, n_labels)."""
        return self.answer_logits(self.hidden_states(input_ids), attention_mask, label_ids)

    def lowest_trainable_layer(self) -> int:
        """The lowest layer holding a trainable weight (the number of layers if none): below it, a prompt's
        states never change while MeZO trains (`far.llm.prefix`).
        """
        for i, layer in enumerate(self.layers):
            if any(isinstance(w, CompactWeight) and w.trainable for w in layer.modules()):
                return i
        return len(self.layers)

    def _next_token_positions(self, input_ids: Tensor, start: Tensor | None, start_layer: int) -> tuple[Tensor, Tensor]:
        """The final norm's output at every position but the last, (B * (T - 1), hidden), and its targets."""
        if start is None and start_layer:
            raise ValueError("start_layer needs start, the input of that layer (e.g. a PrefixCache's states)")
        h = self.run_layers(self.embed(input_ids) if start is None else start, start_layer)
        hidden = self.norm(h[:, :-1]).reshape(-1, h.shape[-1])
        return hidden, input_ids[:, 1:].reshape(-1)

    def next_token_loss(self, input_ids: Tensor, start: Tensor | None = None, start_layer: int = 0) -> Tensor:
        """Mean next-token cross-entropy over packed rows (B, T), no padding, without the vocabulary's logits
        held whole. With `start` (the input of layer `start_layer`), only the layers from there run.
        """
        hidden, targets = self._next_token_positions(input_ids, start, start_layer)
        return next_token_loss(hidden, targets, self.embed_tokens, self.config.vocab_size)

    @torch.no_grad()
    def next_token_counts(
        self, input_ids: Tensor, start: Tensor | None = None, start_layer: int = 0
    ) -> tuple[float, int, int]:
        """Summed negative log-likelihood, arg-max hits and predicted positions of packed rows (B, T)."""
        hidden, targets = self._next_token_positions(input_ids, start, start_layer)
        return next_token_counts(hidden, targets, self.embed_tokens, self.config.vocab_size)

    def new_cache(self) -> KVCache:
        """An empty `KVCache` for `next_token_logits`."""
        return KVCache(len(self.layers))

    @torch.no_grad()
    def next_token_logits(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits over the vocabulary for the token after each row's last, (B, vocab); with a `cache`,
        `input_ids` are the tokens after those it holds, and it is extended with them.
        """
        self._check_not_released(0)
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, cache)
        return tied_logits(self.norm(h[:, -1]), self.embed_tokens, self.config.vocab_size)

    def logits(self, input_ids: Tensor) -> Tensor:
        """Full (B, T, vocab) logits, for tests and checks only (the vocabulary is large)."""
        h = self.norm(self.hidden_states(input_ids))
        return h @ self.embed_tokens.rows(torch.arange(self.config.vocab_size)).t()


def from_state_dict(
    config: LeanConfig, state_dict: Mapping[str, Tensor], dtype: torch.dtype = torch.float32
) -> LeanCausalLM:
    """A `LeanCausalLM` from a transformers Llama / Gemma-3 state dict, the embedding dense in `dtype`."""
    embedding = DenseEmbedding(state_dict["model.embed_tokens.weight"], dtype)
    return LeanCausalLM(config, embedding, lambda name: state_dict[name], dtype).eval()


__all__ = ["DenseEmbedding", "KVCache", "LeanCausalLM", "Q8Embedding", "from_state_dict"]
