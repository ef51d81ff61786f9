"""The BERT encoder in plain torch, every module and parameter named as transformers names it.

transformers' model code costs more resident memory than MiniLM's weights (torch._dynamo, sympy,
scipy, accelerate: docs/design.md, "Resident memory"); this file uses only `BertConfig`. Its modules
carry transformers' names (`encoder.layer.3.intermediate.dense`, ...), so a transformers state dict
loads by name and `far.find_ffns`, `far.reconfigure` and learners files work unchanged.

    >>> encoder = LeanBertModel(BertConfig())
    >>> encoder(input_ids, attention_mask)   # (B, T, hidden): the last layer's hidden states
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import BertConfig

from far.llm.recompute import Recompute

# config.hidden_act -> function. transformers' "gelu_new" is the tanh formula written out; torch's
# fused tanh GELU computes the same to rounding.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def check_model_type(model_type: str | None) -> None:
    """Raise ValueError, saying what to do, unless `model_type` is "bert"."""
    if model_type != "bert":
        raise ValueError(
            f"the lean encoder runtime supports BERT only (model_type 'bert'), got model_type {model_type!r}; run "
            "this model with transformers (--runtime transformers), or use a BERT model (e.g. --model minilm)"
        )


def check_config(config: BertConfig) -> None:
    """Raise ValueError, saying what to do, for a config the lean encoder cannot run."""
    check_model_type(getattr(config, "model_type", None))
    if config.hidden_act not in ACTIVATIONS:
        raise ValueError(
            f"the lean encoder runtime does not support hidden_act={config.hidden_act!r}; supported: "
            f"{', '.join(ACTIVATIONS)}; run this model with transformers (--runtime transformers)"
        )
    position = getattr(config, "position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"the lean encoder runtime supports absolute position embeddings only, got position_embedding_type="
            f"{position!r}; run this model with transformers (--runtime transformers)"
        )
    if config.is_decoder or config.add_cross_attention:
        raise ValueError("the lean encoder runtime runs BERT as an encoder only; set is_decoder=False")
    if config.hidden_size % config.num_attention_heads:
        raise ValueError(
            f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads {config.num_attention_heads}"
        )


@torch.no_grad()
def init_weights(module: nn.Module, std: float, generator: torch.Generator | None = None) -> None:
    """transformers' BERT initialisation of `module` and its children: normal(0, std) weights, zero biases,
    LayerNorms at (1, 0), the padding embedding row zero. Draws from `generator` (default: torch's)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.normal_(0.0, std, generator=generator)
        if isinstance(m, nn.Linear) and m.bias is not None:
            m.bias.zero_()
        elif isinstance(m, nn.Embedding) and m.padding_idx is not None:
            m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None) -> Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # (1, T)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        # Summed in transformers' order, so that fp32 rounding agrees too.
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        h = h + self.position_embeddings(position_ids)  # (B, T, hidden)
        return self.dropout(self.LayerNorm(h))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)  # applied inside SDPA, as dropout_p

    def forward(self, h: Tensor, mask: Tensor | None) -> Tensor:
        b, t, _ = h.shape
        # The head count comes from the projections' width (-1): FAR's head split keeps it, reordered.
        q, k, v = (p(h).view(b, t, -1, self.head_size).transpose(1, 2) for p in (self.query, self.key, self.value))
        p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, heads, T, head_size)
        return out.transpose(1, 2).reshape(b, t, -1)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig, in_features: int | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, h: Tensor, mask: Tensor | None) -> Tensor:
        return self.output(self.self(h, mask), h)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACTIVATIONS[config.hidden_act]

    def forward(self, h: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(h))  # (B, T, intermediate)


class BertOutput(BertSelfOutput):
    """The FFN's output projection (from the intermediate width), dropout, residual and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, config.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, h: Tensor, mask: Tensor | None) -> Tensor:
        a = self.attention(h, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, h: Tensor, mask: Tensor | None) -> Tensor:
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:
            if recompute and (h.requires_grad or any(p.requires_grad for p in layer.parameters())):
                # The Function's output needs grad only if its tensor input does; a frozen layer below
                # (or frozen embeddings) would otherwise cut this layer's parameters off from the loss.
                h = Recompute.apply(layer, h if h.requires_grad else h.detach().requires_grad_(True), mask)
            else:
                h = layer(h, mask)
        return h


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h: Tensor) -> Tensor:
        return torch.tanh(self.dense(h[:, 0]))  # (B, hidden): the first ([CLS]) token


class LeanBertModel(nn.Module):
    """BERT's embeddings, encoder and (optionally) pooler: what `bert.` names in a transformers checkpoint."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """The last layer's hidden states, (B, T, hidden)."""
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T): every query sees the real keys
        return self.encoder(self.embeddings(input_ids, token_type_ids, position_ids), mask)


__all__ = ["ACTIVATIONS", "LeanBertModel", "check_config", "check_model_type", "init_weights"]
