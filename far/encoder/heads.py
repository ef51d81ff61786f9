"""Lean BERT task models: sequence classification (and regression) and extractive question answering.

Each is `bert` (a `far.encoder.bert.LeanBertModel`) plus transformers' head for the task, named
and computing as `BertForSequenceClassification` / `BertForQuestionAnswering` do, losses included.
Forward returns transformers' own output classes (`transformers.modeling_outputs` is light: it
does not import the model code), so `output.loss`, `output["loss"]` and `output.get("loss")` work.

    >>> model = LeanBertForSequenceClassification(BertConfig(num_labels=3))
    >>> model(input_ids, attention_mask, labels=labels).loss.backward()
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import BertConfig
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput

from far.encoder.bert import LeanBertModel, check_config, init_weights


class _LeanBert(nn.Module):
    """What both heads share: the config, the base model, and transformers' method names far calls."""

    supports_gradient_checkpointing = True
    base_model_prefix = "bert"
    hf_class_name = ""  # the transformers class it saves as (config.architectures), for AutoModelFor* and far
    bert: LeanBertModel

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        check_config(config)
        self.config = config
        self.num_labels = config.num_labels

    @property
    def base_model(self) -> LeanBertModel:
        return self.bert

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.bert.encoder.gradient_checkpointing

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer in backward, in training mode (transformers' name; its kwargs are ignored)."""
        self.bert.encoder.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.bert.encoder.gradient_checkpointing = False

    def num_parameters(self, only_trainable: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not only_trainable)

    def save_pretrained(self, folder: str | os.PathLike, **kwargs: object) -> None:
        """config.json and model.safetensors of the state dict as it is, into `folder` (transformers' method
        name, which `far.save_pretrained` calls; its options are transformers' and do not apply here).

        A reconfigured model's split layers are saved as they are: `far.save_pretrained` adds the FAR
        entry that `far.from_pretrained` rebuilds them from. For a plain folder use
        `far.encoder.save_pretrained`.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.config.architectures = [self.hf_class_name]
        self.config.save_pretrained(folder)
        tensors = {k: v if v.is_contiguous() else v.contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def sequence_classification_loss(config: BertConfig, logits: Tensor, labels: Tensor) -> Tensor:
    """transformers' BertForSequenceClassification loss, including its inference of `config.problem_type`."""
    n = config.num_labels
    if config.problem_type is None:  # set on the config, as transformers does, so later batches agree
        if n == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        return F.mse_loss(logits.squeeze(), labels.squeeze()) if n == 1 else F.mse_loss(logits, labels)
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, n), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels)


class LeanBertForSequenceClassification(_LeanBert):
    """BERT with transformers' sequence-classification head (pooler, dropout, `classifier`).

    Args:
        config: A `BertConfig`; `num_labels`, `problem_type` and `classifier_dropout` shape the head.
    """

    hf_class_name = "BertForSequenceClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = LeanBertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> SequenceClassifierOutput:
        """`.logits` (B, num_labels), and `.loss` when `labels` are given (None otherwise)."""
        h = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits = self.classifier(self.dropout(self.bert.pooler(h)))
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class LeanBertForQuestionAnswering(_LeanBert):
    """BERT with transformers' extractive question-answering head (`qa_outputs`, no pooler).

    Args:
        config: A `BertConfig` with `num_labels=2` (start and end).
    """

    hf_class_name = "BertForQuestionAnswering"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if config.num_labels != 2:
            raise ValueError(f"question answering needs num_labels=2 (start, end), got {config.num_labels}")
        self.bert = LeanBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
    ) -> QuestionAnsweringModelOutput:
        """`.start_logits` and `.end_logits` (B, T), and `.loss` when both positions are given."""
        logits = self.qa_outputs(self.bert(input_ids, attention_mask, token_type_ids, position_ids))  # (B, T, 2)
        start, end = (x.squeeze(-1).contiguous() for x in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions past the sequence (answers cut off by truncation) are clamped to T and ignored.
            ignored = start.shape[1]
            start_positions = start_positions.view(-1).clamp(0, ignored)
            end_positions = end_positions.view(-1).clamp(0, ignored)
            loss = (
                F.cross_entropy(start, start_positions, ignore_index=ignored)
                + F.cross_entropy(end, end_positions, ignore_index=ignored)
            ) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end)


__all__ = ["LeanBertForQuestionAnswering", "LeanBertForSequenceClassification", "sequence_classification_loss"]
