"""What an ExecuTorch export reads from a FAR-reconfigured model, checked before anything is built or written.

`plan_export` refuses, naming what and why, what the export view cannot represent: an architecture not
in `EXPORTABLE`, a model FAR did not reconfigure, split attention heads, a dtype other than float32,
a sequence length beyond the model's positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from far.architectures import BUILTIN_SPECS, CAUSAL_LM_TYPES, FFN, AttentionSpec, model_type, resolve_attention_spec
from far.config import FARConfig
from far.encoder.bert import ACTIVATIONS
from far.freezing import find_layers, frozen_depth
from far.saving.fingerprint import base_fingerprint, outside_split
from far.saving.labels import head_fields
from far.surgery.state import get_config, is_reconfigured, learners, node_groups


@dataclass(frozen=True)
class Layout:
    """Where an architecture keeps what the export view rebuilds, relative to the model's root."""

    embeddings: str
    pooler: str
    classifier: str


# The architectures the export view rebuilds, and why the others that far reconfigures
# (far.architectures.BUILTIN_SPECS) cannot be exported yet. The layers' projections are named by
# far.architectures (FFN and attention specs); only what lies around the layers is named here.
EXPORTABLE: dict[str, Layout] = {
    "bert": Layout(embeddings="bert.embeddings", pooler="bert.pooler.dense", classifier="classifier"),
}
NOT_EXPORTABLE: dict[str, str] = {
    "roberta": "its position ids count from the padding index and skip padding, and its head (dense, tanh, "
    "out_proj) is not BERT's pooler",
    "xlm-roberta": "its position ids count from the padding index and skip padding, and its head (dense, tanh, "
    "out_proj) is not BERT's pooler",
    "electra": "its embeddings are projected (embeddings_project) and its head is ELECTRA's own",
    "distilbert": "its layers, names and head differ from BERT's (no token types, no pooler)",
    "mpnet": "its attention adds a relative position bias shared by all layers",
}


@dataclass(frozen=True)
class ExportPlan:
    """Everything the export takes from the model, as plain values.

    Attributes:
        frozen_layers: K, the bottom layers frozen whole.
        bottom: Whether the embeddings and the bottom K layers form a forward-only program (everything below
            layer K frozen; False: the training program starts from token ids).
        learners: `{ffn name: sorted original learner indices}` (empty in frozen layers).
        labels: Class names in id order; empty for regression.
        base_fingerprint: The learners file's base fingerprint (`far.saving.fingerprint`).
    """

    model_type: str
    layout: Layout
    attention: AttentionSpec
    layers: tuple[str, ...]
    frozen_layers: int
    bottom: bool
    ffns: Mapping[str, FFN]
    learners: Mapping[str, Tensor]
    trainable: tuple[str, ...]
    config: FARConfig
    hidden_size: int
    heads: int
    activation: str
    max_positions: int
    vocab_size: int
    type_vocab_size: int
    labels: tuple[str, ...]
    base_fingerprint: str
    head: dict = field(default_factory=dict)

    @property
    def regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1

    @property
    def trained_layers(self) -> tuple[str, ...]:
        return self.layers[self.frozen_layers :] if self.bottom else self.layers


def _not_exportable(kind: str | None) -> str:
    """Why a `kind` model cannot be exported."""
    if kind in CAUSAL_LM_TYPES:
        return (
            "it is a causal LM (far.architectures.CAUSAL_LM_TYPES); a causal LM exports from far's lean runtime "
            "(far.device.lm_export.export_causal_lm, far export --executorch OUT --model NAME)"
        )
    if kind not in BUILTIN_SPECS:
        return "far does not know its layers (far.architectures has no spec for it)"
    return NOT_EXPORTABLE.get(kind, "far's export view has no layout for it")


def _check_architecture(model: nn.Module) -> tuple[str, Layout]:
    kind = model_type(model)
    if kind not in EXPORTABLE:
        why = _not_exportable(kind)
        raise ValueError(
            f"cannot export a {kind!r} model to ExecuTorch: {why}. far.device exports "
            f"{', '.join(repr(k) for k in EXPORTABLE)} sequence classifiers"
        )
    layout = EXPORTABLE[kind]
    modules = dict(model.named_modules())
    for name in (layout.embeddings, layout.pooler, layout.classifier):
        if name not in modules:
            raise ValueError(
                f"cannot export {type(model).__name__} to ExecuTorch: it has no {name!r}; far.device exports "
                "sequence classifiers with a pooler (e.g. BertForSequenceClassification)"
            )
    config = model.config
    if config.hidden_act not in ACTIVATIONS:
        raise ValueError(f"cannot export hidden_act={config.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or getattr(config, "is_decoder", False):
        raise ValueError("far.device exports BERT encoders with absolute position embeddings only")
    return kind, layout


def _check_far(model: nn.Module) -> FARConfig:
    config = get_config(model)
    if config is None or not is_reconfigured(model):
        raise ValueError(
            "this model is not reconfigured by FAR, so the export has no learners to train: pass the model "
            "far.finetune or `far train` left (far.from_pretrained(RUN/model)), or a stock model with a learners "
            "file applied (far.load_learners(model, FILE); far export --learners FILE)"
        )
    if config.attention_retention is not None:
        raise ValueError(
            "this model's attention heads are split by FAR (attention_retention set); the ExecuTorch export splits "
            "FFNs only. Export a model reconfigured without attention_retention"
        )
    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if wrong:
        raise ValueError(
            f"the ExecuTorch training program runs in float32; this model holds {wrong}: call model.float() first"
        )
    return config


def _labels(model: nn.Module) -> tuple[str, ...]:
    config = model.config
    if getattr(config, "problem_type", None) == "multi_label_classification":
        raise ValueError("far.device trains single-label classification and regression, not multi-label problems")
    if config.num_labels == 1:
        return ()
    return tuple(str(config.id2label[i]) for i in range(config.num_labels))


def plan_export(model: nn.Module, max_length: int) -> ExportPlan:
    """Check that `model` can become an ExecuTorch training program of `max_length` tokens, and read its plan.

    Args:
        model: A BERT sequence classifier reconfigured by FAR (`far.finetune`, `far train`,
            `far.from_pretrained` of a FAR checkpoint, or `far.load_learners` on a stock model).

    Raises:
        ValueError: what cannot be exported, and why; nothing has been built or written.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    kind, layout = _check_architecture(model)
    far_config = _check_far(model)
    config = model.config
    positions = int(config.max_position_embeddings)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or not 1 <= max_length <= positions:
        raise ValueError(
            f"max_length must be a whole number in [1, {positions}] (the model has {positions} position "
            f"embeddings), got {max_length!r}"
        )
    groups = node_groups(model)
    chosen = learners(model)
    k, _, below = frozen_depth(model)
    trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    if not trainable:
        raise ValueError("nothing in this model is trainable; there is nothing to train on the device")
    others = outside_split(model, trainable)
    return ExportPlan(
        model_type=kind,
        layout=layout,
        attention=resolve_attention_spec(model),
        layers=tuple(find_layers(model)),
        frozen_layers=k,
        bottom=below,
        ffns=dict(groups),
        learners=chosen,
        trainable=trainable,
        config=far_config,
        hidden_size=int(config.hidden_size),
        heads=int(config.num_attention_heads),
        activation=str(config.hidden_act),
        max_positions=positions,
        vocab_size=int(config.vocab_size),
        type_vocab_size=int(config.type_vocab_size),
        labels=_labels(model),
        base_fingerprint=base_fingerprint(model, groups, chosen, others),
        head=head_fields(model),
    )
