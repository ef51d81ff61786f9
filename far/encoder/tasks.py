"""The config fields each task kind sets on an encoder, for transformers' models and the lean ones alike.

Plain Python (no transformers import), so that choosing a model's head costs nothing to import.
"""

from __future__ import annotations

from collections.abc import Sequence

TASK_KINDS = ("classification", "regression", "question-answering")


def task_overrides(task_kind: str, num_labels: int, label_names: Sequence[str] | None) -> dict:
    """Config fields a task sets, as `far.models.load_model_and_tokenizer` sets them for transformers models."""
    if task_kind not in TASK_KINDS:
        raise ValueError(f"task_kind must be one of {', '.join(TASK_KINDS)}, got {task_kind!r}")
    if task_kind == "regression":
        return {"num_labels": 1, "problem_type": "regression"}
    if task_kind == "question-answering":
        return {"num_labels": 2}  # start and end
    names = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(num_labels)]
    if len(names) != num_labels or num_labels < 2:
        raise ValueError(f"num_labels must be at least 2 and match label_names, got {num_labels} and {names}")
    return {
        "num_labels": num_labels,
        "id2label": dict(enumerate(names)),
        "label2id": {n: i for i, n in enumerate(names)},
        "problem_type": "single_label_classification",
    }
