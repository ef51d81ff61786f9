"""The export view of a lean causal LM: its own modules traced as they are, with twins (sharing the model's
frozen tensors) of what torch.export cannot take:

- `CompactLinear` -> `PlainLinear`: one product, so autograd gives each trainable block its gradient
  (the lean linear hands weight gradients to a sink instead);
- attention -> `EagerAttention`, an explicit softmax: SDPA's backward is not in ExecuTorch's core set;
- a Q8_0 embedding -> `Q8Rows`: int8 values and fp32 scales as two tensors, no byte reinterpreting.

Trainable weights (fp32) become parameters under the lean model's names
(`layers.20.mlp.gate_proj.parts.0.stored`), so a device state maps back by name. `LMBottom` is the
embedding and frozen bottom (forward only); `LMTop` the layers above, the final norm and the sliced
next-token loss (`far.llm.next_token.next_token_loss_in_graph`).

    >>> bottom, top = lm_views(model)
    >>> loss, hits = top(bottom(ids), ids)
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from far.llm.compact import CompactLinear, CompactWeight, Q8Embedding
from far.llm.lean_model import Attention, LeanCausalLM
from far.llm.next_token import next_token_loss_in_graph


class PlainLinear(CompactLinear):
    """A `CompactLinear`'s blocks as one plain product: autograd reaches each trainable block."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight_value())


class EagerAttention(Attention):
    """The lean attention with an explicit softmax in place of SDPA (whose backward ExecuTorch lacks)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        c = self.config
        groups = c.num_heads // c.num_kv_heads  # SDPA's enable_gqa: head i reads key/value head i // groups
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-2, -1)) * c.query_scale  # (B, heads, T, S)
        if mask is None:  # causal, queries and keys aligned at the first token
            mask = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, heads, T, head_dim)


class Q8Rows(nn.Module):
    """A `Q8Embedding`'s rows as int8 values times fp32 block scales: the same fp32 rows, traceable."""

    def __init__(self, embedding: Q8Embedding) -> None:
        super().__init__()
        hidden = embedding.hidden_size
        raw = embedding.blocks.view(embedding.blocks.shape[0], hidden // 32, 34)
        self.register_buffer("scales", raw[..., :2].contiguous().view(torch.float16).float().squeeze(-1))  # (V, n/32)
        self.register_buffer("values", raw[..., 2:].contiguous().view(torch.int8).reshape(-1, hidden))  # (V, n)
        self.hidden_size = hidden

    def rows(self, ids: Tensor) -> Tensor:
        blocks = self.values[ids].float().view(*ids.shape, self.hidden_size // 32, 32)
        return (self.scales[ids].unsqueeze(-1) * blocks).view(*ids.shape, self.hidden_size)


def _weight(weight: CompactWeight, trainable: bool) -> CompactWeight:
    """A twin of `weight`: its own fp32 parameter requiring gradients if it trains here, else the shared tensor."""
    twin = copy.copy(weight)
    twin._parameters = dict(weight._parameters)
    if trainable and weight.trainable:
        twin.stored = nn.Parameter(weight.stored.detach().clone(), requires_grad=True)
    return twin


def _view(
    module: nn.Module,
    trainable: bool,
    attention: type[Attention] = EagerAttention,
    linear: type[CompactLinear] = PlainLinear,
) -> nn.Module:
    """A twin of `module` whose parts torch.export can trace and differentiate (module docstring), its attention
    an `attention` and its linear layers `linear`s.
    """
    if isinstance(module, CompactWeight):
        return _weight(module, trainable)
    children = {name: _view(child, trainable, attention, linear) for name, child in module._modules.items()}
    if isinstance(module, CompactLinear):
        return linear(list(children["parts"]), module.node_dim)
    kind = attention if type(module) is Attention else type(module)
    twin = kind.__new__(kind)
    twin.__dict__ = {**module.__dict__, "_modules": children}
    twin._parameters, twin._buffers = dict(module._parameters), dict(module._buffers)
    return twin


def _embedding(embedding: nn.Module) -> nn.Module:
    return Q8Rows(embedding) if isinstance(embedding, Q8Embedding) else embedding


class LMBottom(nn.Module):
    """The embedding and the frozen bottom layers: ids (B, T) -> the first trained layer's input (B, T, hidden)."""

    def __init__(self, model: LeanCausalLM, depth: int, embedding: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embedding
        self.layers = nn.ModuleList(_view(layer, False) for layer in model.layers[:depth])
        self.embed_scale = model.embed_scale

    def forward(self, input_ids: Tensor) -> Tensor:
        h = self.embed_tokens.rows(input_ids)  # as LeanCausalLM.embed
        h = h * self.embed_scale if self.embed_scale != 1.0 else h
        for layer in self.layers:
            h = layer(h)
        return h


class LMTop(nn.Module):
    """The trained layers, the final norm and the mean next-token loss of packed rows.

    `forward(hidden, input_ids)` -> (mean cross-entropy of position t predicting t + 1, arg-max hits (int64)).
    """

    def __init__(self, model: LeanCausalLM, depth: int, embedding: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): _view(model.layers[i], True) for i in range(depth, len(model.layers))})
        self.norm = _view(model.norm, True)
        self.embed_tokens = embedding  # the tied output head, frozen
        self.vocab_size = model.config.vocab_size

    def forward(self, hidden: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        h = hidden
        for layer in self.layers.values():
            h = layer(h)
        final = self.norm(h[:, :-1]).reshape(-1, h.shape[-1])  # (B * (T - 1), hidden), as next_token_loss reads
        targets = input_ids[:, 1:].reshape(-1)
        return next_token_loss_in_graph(final, targets, self.embed_tokens, self.vocab_size)


def lm_views(model: LeanCausalLM, depth: int) -> tuple[LMBottom, LMTop]:
    """The bottom (layers below `depth`, forward only) and the trained top of `model`, sharing its frozen tensors."""
    embedding = _embedding(model.embed_tokens)
    return LMBottom(model, depth, embedding).eval(), LMTop(model, depth, embedding).train()


def decoding_twins(
    model: LeanCausalLM, attention: type[Attention], linear: type[CompactLinear]
) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """The embedding, every layer and the final norm of `model` as export twins for decoding: each trainable weight
    its own parameter (named as in the model), the frozen tensors shared, the attention an `attention`, the linear
    layers `linear`s.
    """
    layers = nn.ModuleList(_view(layer, True, attention, linear) for layer in model.layers)
    return _embedding(model.embed_tokens), layers, _view(model.norm, True)
