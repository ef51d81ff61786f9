"""A task head's labels as a learners file carries them: what a bare base needs to name the head's outputs.

`to_diff_dict` leaves out fields at their defaults, so a two-class model (transformers' `LABEL_0`,
`LABEL_1`) would record no labels and a reader could not tell its head's size: the head's fields are
recorded explicitly, and `far.load_learners` puts them on the model (the base's back on unload).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn


def head_fields(model: nn.Module) -> dict:
    """The head's fields of `model.config`, JSON-ready (id2label keyed by strings); {} without a config.

    Example:
        >>> head_fields(AutoModelForSequenceClassification.from_config(BertConfig(num_labels=2)))
        {'num_labels': 2, 'id2label': {'0': 'LABEL_0', '1': 'LABEL_1'}, 'label2id': {...}, 'problem_type': None}
    """
    config = getattr(model, "config", None)
    id2label = getattr(config, "id2label", None)
    if not isinstance(id2label, Mapping):
        return {}
    return {
        "num_labels": len(id2label),
        "id2label": {str(i): str(name) for i, name in id2label.items()},
        "label2id": {str(name): int(i) for name, i in (getattr(config, "label2id", None) or {}).items()},
        "problem_type": getattr(config, "problem_type", None),
    }


def set_head_fields(model: nn.Module, fields: Mapping) -> None:
    """Put recorded head fields on `model.config`, only where they label as many outputs as the model's head has
    (whose tensors were checked to have the file's size before).
    """
    config = getattr(model, "config", None)
    id2label = fields.get("id2label")
    current = getattr(config, "id2label", None)
    if not isinstance(id2label, Mapping) or not isinstance(current, Mapping) or len(id2label) != len(current):
        return
    try:
        names = {int(i): str(name) for i, name in id2label.items()}
        ids = {str(name): int(i) for name, i in (fields.get("label2id") or {}).items()}
    except (TypeError, ValueError):  # ids that are not whole numbers: not labels far can use
        return
    config.id2label, config.label2id = names, ids or {name: i for i, name in names.items()}
    if "problem_type" in fields:
        config.problem_type = fields["problem_type"]
