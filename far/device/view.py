"""The export view: a FAR-reconfigured BERT classifier as plain torch modules that torch.export can trace.

`far.SplitLinear` (one tensor, two views, custom autograd, casting caches) is opaque to `torch.export`;
the view rebuilds the same function from plain parts, learners first, so no permutation is needed:

    up(x)   = cat(x @ Wl^T + bl, x @ Wf^T + bf)            # (B, T, k) | (B, T, n - k)
    down(a) = a[..., :k] @ Vl^T + a[..., k:] @ Vf^T + b     # two products: no gradient for Vf

Each part keeps ascending node order, so a learner tensor is what a learners file stores under the same
name; every other tensor keeps its model name and trainability. The lean encoder's modules
(`far.encoder.bert`) run their own forward, with eager attention (SDPA's backward is not in ExecuTorch's
core operator set) and no dropout. `BottomView` is the frozen embeddings and bottom K layers, forward
only; `TrainView` the layers above, the head and the loss (`TrainFromTokens` without a frozen bottom).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from far.encoder.bert import (
    ACTIVATIONS,
    BertAttention,
    BertEmbeddings,
    BertIntermediate,
    BertLayer,
    BertOutput,
    BertSelfOutput,
)


def _put(root: nn.Module, name: str, module: nn.Module) -> None:
    """Register `module` under the dotted `name` of `root`, creating empty containers on the way."""
    *path, leaf = name.split(".")
    parent = root
    for part in path:
        child = parent._modules.get(part)
        if child is None:
            child = nn.Module()
            parent.add_module(part, child)
        parent = child
    parent.add_module(leaf, module)


def _parameter(tensor: Tensor, trainable: bool) -> nn.Parameter:
    return nn.Parameter(tensor.detach().clone().contiguous(), requires_grad=trainable)


class SplitUp(nn.Module):
    """An FFN input projection: learner rows (trainable), then frozen rows (constant buffers)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, learners: Tensor, frozen: Tensor, trainable: bool) -> None:
        super().__init__()
        self.k, self.n = learners.numel(), learners.numel() + frozen.numel()
        self.learner_weight = _parameter(weight[learners], trainable)  # (k, in)
        self.learner_bias = None if bias is None else _parameter(bias[learners], trainable)  # (k,)
        self.register_buffer("frozen_weight", weight[frozen].clone())  # (n - k, in)
        self.register_buffer("frozen_bias", None if bias is None else bias[frozen].clone())

    def forward(self, x: Tensor) -> Tensor:
        if self.k == 0:
            return F.linear(x, self.frozen_weight, self.frozen_bias)
        learned = F.linear(x, self.learner_weight, self.learner_bias)  # (B, T, k)
        if self.k == self.n:
            return learned
        return torch.cat([learned, F.linear(x, self.frozen_weight, self.frozen_bias)], dim=-1)  # (B, T, n)


class SplitDown(nn.Module):
    """An FFN output projection: learner columns (trainable), frozen columns (constant), the bias as it was."""

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        learners: Tensor,
        frozen: Tensor,
        trainable: bool,
        bias_trainable: bool,
    ) -> None:
        super().__init__()
        self.k, self.n = learners.numel(), learners.numel() + frozen.numel()
        self.learner_weight = _parameter(weight[:, learners], trainable)  # (out, k)
        self.register_buffer("frozen_weight", weight[:, frozen].clone().contiguous())  # (out, n - k)
        self.bias = None if bias is None else _parameter(bias, bias_trainable)

    def forward(self, a: Tensor) -> Tensor:
        k = self.k
        if k == 0:
            return F.linear(a, self.frozen_weight, self.bias)
        y = F.linear(a[..., :k], self.learner_weight, self.bias)  # (B, T, out)
        if k == self.n:
            return y
        return y + F.linear(a[..., k:], self.frozen_weight)  # backward gives the frozen part no weight gradient


class EagerSelfAttention(nn.Module):
    """BERT's self-attention with an explicit softmax over an additive mask (SDPA's backward is not in
    ExecuTorch's core operator set).
    """

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, heads: int) -> None:
        super().__init__()
        self.query, self.key, self.value, self.heads = query, key, value, heads

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        b, t, width = h.shape
        d = width // self.heads
        q, k, v = (p(h).view(b, t, self.heads, d).transpose(1, 2) for p in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(d)) + mask  # (B, heads, T, T)
        return torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).reshape(b, t, width)  # (B, T, hidden)


# The lean encoder's classes that apply dropout in their forward.
_DROPOUT = (BertEmbeddings, BertSelfOutput, BertOutput)


def _assemble(cls: type[nn.Module], children: dict[str, nn.Module], **attributes) -> nn.Module:
    """A lean encoder module of class `cls` made of `children`, without running `__init__` (it would allocate
    weights replaced at once); dropout becomes `nn.Identity`.
    """
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for name, child in children.items():
        module.add_module(name, child)
    if "dropout" not in children and cls in _DROPOUT:
        module.add_module("dropout", nn.Identity())
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def embeddings(word: nn.Embedding, position: nn.Embedding, token_type: nn.Embedding, norm: nn.LayerNorm) -> nn.Module:
    """The lean encoder's `BertEmbeddings` over these tensors: (input ids, token types, None) -> (B, T, hidden)."""
    parts = {"word_embeddings": word, "position_embeddings": position, "token_type_embeddings": token_type}
    return _assemble(BertEmbeddings, {**parts, "LayerNorm": norm})


def layer(parts: dict[str, nn.Module], heads: int, activation: str) -> nn.Module:
    """The lean encoder's `BertLayer` over the model's modules, with eager attention and the split FFN."""
    q, k, v = (parts[f"attention.self.{p}"] for p in ("query", "key", "value"))
    attention_output = {"dense": parts["attention.output.dense"], "LayerNorm": parts["attention.output.LayerNorm"]}
    attention = {"self": EagerSelfAttention(q, k, v, heads), "output": _assemble(BertSelfOutput, attention_output)}
    intermediate = _assemble(
        BertIntermediate, {"dense": parts["intermediate.dense"]}, intermediate_act_fn=ACTIVATIONS[activation]
    )
    output = _assemble(BertOutput, {"dense": parts["output.dense"], "LayerNorm": parts["output.LayerNorm"]})
    return _assemble(
        BertLayer, {"attention": _assemble(BertAttention, attention), "intermediate": intermediate, "output": output}
    )


def additive_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, T) 1/0 -> (B, 1, 1, T): 0 where a key is real, the dtype's minimum where it is padding."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class _Stack(nn.Module):
    """What both programs share: modules registered under their model names, and the layers in order."""

    def __init__(self, modules: dict[str, nn.Module], layer_names: list[str]) -> None:
        super().__init__()
        for name, module in modules.items():
            _put(self, name, module)
        self.layer_names = tuple(layer_names)

    def _run_layers(self, h: Tensor, attention_mask: Tensor) -> Tensor:
        mask = additive_mask(attention_mask, h.dtype)
        for name in self.layer_names:
            h = self.get_submodule(name)(h, mask)
        return h


class BottomView(_Stack):
    """The frozen bottom, forward only: token ids -> the hidden states at the first trained layer."""

    def __init__(self, modules: dict[str, nn.Module], embeddings: str, layer_names: list[str]) -> None:
        super().__init__(modules, layer_names)
        self.embeddings_name = embeddings

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        h = self.get_submodule(self.embeddings_name)(input_ids, token_type_ids, None)
        return self._run_layers(h, attention_mask)  # (B, T, hidden)


class TrainView(_Stack):
    """The trained top: (hidden at the first trained layer, attention mask, labels) -> (loss, logits), the loss
    as transformers' BertForSequenceClassification computes it (cross-entropy, or MSE for regression).
    """

    def __init__(
        self, modules: dict[str, nn.Module], layer_names: list[str], pooler: str, classifier: str, regression: bool
    ) -> None:
        super().__init__(modules, layer_names)
        self.pooler_name, self.classifier_name, self.regression = pooler, classifier, regression

    def logits(self, h: Tensor, attention_mask: Tensor) -> Tensor:
        h = self._run_layers(h, attention_mask)
        pooled = torch.tanh(self.get_submodule(self.pooler_name)(h[:, 0]))  # (B, hidden): the first token
        return self.get_submodule(self.classifier_name)(pooled)  # (B, num_labels)

    def forward(self, hidden: Tensor, attention_mask: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.logits(hidden, attention_mask)
        if self.regression:
            loss = F.mse_loss(logits.squeeze(-1), labels)
        else:
            loss = F.cross_entropy(logits, labels)
        return loss, logits.detach()  # the joint graph differentiates the loss only


class TrainFromTokens(TrainView):
    """`TrainView` with the embeddings trained too: (token ids, attention mask, token types, labels)."""

    def __init__(
        self,
        modules: dict[str, nn.Module],
        embeddings: str,
        layer_names: list[str],
        pooler: str,
        classifier: str,
        regression: bool,
    ) -> None:
        super().__init__(modules, layer_names, pooler, classifier, regression)
        self.embeddings_name = embeddings

    def forward(  # type: ignore[override]
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, labels: Tensor
    ) -> tuple[Tensor, Tensor]:
        hidden = self.get_submodule(self.embeddings_name)(input_ids, token_type_ids, None)
        return super().forward(hidden, attention_mask, labels)
