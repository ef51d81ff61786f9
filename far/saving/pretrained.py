"""FAR checkpoints: Hugging Face folders that keep a reconfigured model's layout.

Two layouts, both read by `far.from_pretrained`:

- `far.save_pretrained` writes the split layers as they are (`learner_weight`, `frozen_weight`,
  `node_order`, ...) to model.safetensors and the `FARConfig` to config.json under the key `"far"`;
  only far reads it.
- `far.training.trainer.FARTrainer` writes the plain model (the merged tensors `far.restore` would
  give), which plain transformers loads, with far_layout.safetensors (`far.saving.layout.write_layout`)
  and learners.safetensors (`far.save_learners`) beside it (`write_far_files`). `load_folder` loads
  either layout into a live model, as a resumed or best-model Trainer run needs.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import transformers
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import AutoConfig

from far.architectures import FFNSpec
from far.config import FARConfig
from far.saving.layout import (
    LAYOUT_FILE,
    read_layout_file,
    rebuild_from_learners,
    rebuild_layout,
    same_learners,
    write_layout,
)
from far.saving.learners_file import save_learners
from far.saving.safetensors_file import LEARNERS_FILE  # beside a FARTrainer folder's plain weights
from far.saving.stock import weight_files
from far.storage.atomic import atomic_dir
from far.surgery.reconfigure import restore
from far.surgery.state import get_config, is_reconfigured

FAR_KEY = "far"  # config.json entry of a FAR checkpoint
FORMAT_VERSION = 2  # 2: split projections stored node-major (one row per node)
CONFIG_NAME = "config.json"


def write_pretrained(model: nn.Module, folder: Path, **kwargs) -> None:
    """Write `model` into the (new, empty) `folder` as `save_pretrained` does, plus the FAR entry."""
    config = get_config(model)
    if config is not None:
        # Keep the module names exactly as the split layers have them (no legacy key renaming).
        kwargs.setdefault("save_original_format", False)
    model.save_pretrained(folder, **kwargs)
    config_path = folder / CONFIG_NAME
    data = json.loads(config_path.read_text())
    data.pop(FAR_KEY, None)  # a stale entry must never describe a plain model
    if config is not None:
        data[FAR_KEY] = {"format_version": FORMAT_VERSION, "config": config.to_dict()}
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_pretrained(model: nn.Module, path: str | os.PathLike, **kwargs) -> Path:
    """Save a plain or reconfigured model as a Hugging Face folder, atomically.

    A reconfigured model keeps its FAR layout: the split layers' weights (with `node_order`) go to
    model.safetensors and its `FARConfig` to config.json under `"far"`; `far.from_pretrained`
    rebuilds it. For an ordinary checkpoint that any transformers user can load, save
    `far.restore(model)` instead.

    Args:
        model: A transformers `PreTrainedModel` (or a `far.encoder` model), plain or reconfigured.
        path: Output folder; an existing one is replaced only once the new one is complete.
        **kwargs: Passed on to the model's `save_pretrained` (e.g. `max_shard_size`).

    Returns:
        The folder written.

    Example:
        >>> far.save_pretrained(model, "ckpt")           # FAR layout kept
        >>> model = far.from_pretrained("ckpt")          # reconfigured, ready to train on
    """
    # A transformers model, or one with its saving method and config (the lean encoder runtime's): checked by
    # what is used, so that saving never imports transformers' model code (~140 MB resident).
    if not (callable(getattr(model, "save_pretrained", None)) and hasattr(getattr(model, "config", None), "to_dict")):
        raise TypeError(
            f"save_pretrained needs a transformers PreTrainedModel (with save_pretrained and a config), "
            f"got {type(model).__name__}"
        )
    if kwargs.get("push_to_hub"):
        raise ValueError("far.save_pretrained does not push to the Hub; save the folder, then upload it")
    if is_reconfigured(model) and get_config(model) is None:
        raise ValueError(
            "this model has split FFN layers but no FAR config (model.far_state is missing); "
            "build it with far.reconfigure or far.from_pretrained"
        )
    with atomic_dir(path) as tmp:
        write_pretrained(model, tmp, **kwargs)
    return Path(path)


def has_far_layout(files: list[Path]) -> bool:
    """Whether these safetensors files hold split FFN layers (read from their headers only)."""
    for file in files:
        with safe_open(file, framework="pt") as f:
            if any(key.endswith(".node_order") for key in f.keys()):
                return True
    return False


def _model_class(config: transformers.PretrainedConfig) -> type:
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return transformers.AutoModel


def _recorded_config(path: Path, entry: object) -> FARConfig | None:
    """The `FARConfig` in config.json's "far" entry; None without one."""
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("format_version") != FORMAT_VERSION:
        version = entry.get("format_version") if isinstance(entry, dict) else None
        older = isinstance(version, int) and version < FORMAT_VERSION
        raise ValueError(
            f"{str(path)!r}: config.json's {FAR_KEY!r} entry has format version {version!r}, this version of far "
            f"reads version {FORMAT_VERSION}; "
            + (
                "it was written by an older far: merge it there (far export --merge) and load the plain model"
                if older
                else "upgrade far"
            )
        )
    try:
        return FARConfig(**entry["config"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{str(path)!r}: config.json's {FAR_KEY!r} entry is invalid: {error}") from error


def _load_far(path: Path, files: list[Path], model_class: type | None, spec: FFNSpec | None, kwargs) -> nn.Module:
    config = AutoConfig.from_pretrained(path)
    far_config = _recorded_config(path, getattr(config, FAR_KEY, None))
    if hasattr(config, FAR_KEY):
        delattr(config, FAR_KEY)  # else a later save of the restored model would carry a stale entry
    cls = model_class or _model_class(config)
    model = cls.from_config(config, **kwargs) if hasattr(cls, "from_config") else cls._from_config(config, **kwargs)
    state_dict = {key: tensor for file in files for key, tensor in load_file(file).items()}
    rebuild_layout(model, state_dict, far_config, spec=spec)
    if far_config is None:
        # Saved by the model's own save_pretrained: the layout is in the weights, the config is not.
        warnings.warn(
            f"{str(path)!r} has FAR split layers but no {FAR_KEY!r} entry in config.json (it was saved with "
            f"model.save_pretrained): the layout was rebuilt from the weights, with retention="
            f"{get_config(model).retention} inferred and selection/seed/freeze_embeddings unknown (recorded as "
            "defaults). Save with far.save_pretrained to keep the FAR config",
            stacklevel=3,
        )
    _load_checked(model, state_dict, path)
    return model.eval()


def _load_checked(
    model: nn.Module,
    state_dict: dict[str, Tensor],
    path: Path,
    hint: str = "pass model_class= (the class the checkpoint was saved from)",
) -> None:
    """`model.load_state_dict(state_dict)`, refused unless every key matches (up to tied duplicates)."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # Hugging Face drops tied duplicates (e.g. lm_head.weight) on save; those alone may be missing.
    tensors = model.state_dict(keep_vars=True)
    loaded = {id(tensors[k]) for k in state_dict if k in tensors}
    missing = [k for k in missing if id(tensors[k]) not in loaded]
    if missing or unexpected:
        raise ValueError(
            f"{str(path)!r} does not match {type(model).__name__} with its FAR layout: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}; {hint}"
        )


def from_pretrained(
    path: str | os.PathLike, model_class: type | None = None, *, spec: FFNSpec | None = None, **kwargs
) -> nn.Module:
    """Load a Hugging Face folder: a FAR checkpoint with its layout, or a plain one as it is.

    Args:
        path: A folder written by `far.save_pretrained`, by a reconfigured model's own
            `save_pretrained` or by `FARTrainer` (plain weights and far_layout.safetensors), or
            any local Hugging Face model folder.
        model_class: Class to build (e.g. `AutoModelForSequenceClassification`); default: the
            class named by `config.architectures`, else `AutoModel`.
        spec: FFN layout for architectures that are not built in.
        **kwargs: For plain weights (with or without a layout file), passed to
            `model_class.from_pretrained`; for split weights, to `from_config` (e.g. `dtype`).

    Returns:
        The model in eval mode; reconfigured (with `far.get_config(model)` set) for a FAR checkpoint
        of either layout.

    Example:
        >>> model = far.from_pretrained("ckpt")
        >>> far.summary(model)
    """
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a Hugging Face model folder (no {CONFIG_NAME})")
    if model_class is not None and not hasattr(model_class, "from_pretrained"):
        raise TypeError(f"model_class must be a transformers model class, got {model_class!r}")
    files = weight_files(path)
    if files and has_far_layout(files):
        return _load_far(path, files, model_class, spec, kwargs)
    if FAR_KEY in json.loads((path / CONFIG_NAME).read_text()):
        raise ValueError(
            f"{str(path)!r}: config.json has a {FAR_KEY!r} entry but its weights hold no FAR layout "
            "(no *.node_order tensors in model.safetensors); the folder is inconsistent, save it again"
        )
    layout = read_layout_file(path)
    cls = model_class or _model_class(AutoConfig.from_pretrained(path))
    model = cls.from_pretrained(path, **kwargs)
    if layout is not None:
        rebuild_from_learners(model, *layout, spec=spec)
        model.eval()
    return model


def is_far_folder(path: str | os.PathLike) -> bool:
    """Whether a saved folder holds a FAR layout: beside plain weights (far_layout.safetensors) or in them."""
    path = Path(path)
    if (path / LAYOUT_FILE).is_file():
        return True
    files = weight_files(path)
    return bool(files) and has_far_layout(files)


def write_far_files(model: nn.Module, folder: str | os.PathLike, *, spec: FFNSpec | None = None) -> None:
    """Write, beside a reconfigured model's plain weights in `folder`, its layout (a FAR checkpoint again) and
    its learners file (what training changed); a model split by hand without a `FARConfig` gets the layout only.
    """
    write_layout(model, folder, spec=spec)
    if get_config(model) is not None:
        save_learners(model, Path(folder) / LEARNERS_FILE, spec=spec)


def remove_far_files(folder: str | os.PathLike) -> None:
    """Remove the files `write_far_files` wrote into `folder`, before a plain model is saved there."""
    folder = Path(folder)
    if (folder / LAYOUT_FILE).is_file():
        (folder / LEARNERS_FILE).unlink(missing_ok=True)
        (folder / LAYOUT_FILE).unlink()


def load_folder(
    model: nn.Module, path: str | os.PathLike, *, config: FARConfig | None = None, spec: FFNSpec | None = None
) -> nn.Module:
    """Load a saved folder's weights into `model`, in place, in the folder's FAR layout.

    For resuming and for a Trainer run's best checkpoint: a FAR folder leaves `model` reconfigured as it
    records; a plain folder leaves it plain. A model already reconfigured with the folder's learners is merged,
    loaded and split again: its split parameters are new objects, so make an optimizer after this.

    Args:
        config: The `FARConfig` to record where the folder holds split weights without one; None infers it.

    Raises:
        ValueError: a plain folder and a reconfigured model, which would mix the two; or a model
            reconfigured with other learners.
    """
    path = Path(path)
    files = weight_files(path)
    if not files:
        raise FileNotFoundError(f"{str(path)!r} holds no safetensors weights (model.safetensors or an index)")
    state_dict = {key: tensor for file in files for key, tensor in load_file(file).items()}
    hint = f"pass a model of the class {str(path)!r} was saved from"
    training = model.training  # split layers are made in training mode: they take the model's back
    layout = read_layout_file(path)
    if layout is None and has_far_layout(files):  # the split layers' own tensors
        entry = json.loads((path / CONFIG_NAME).read_text()).get(FAR_KEY) if (path / CONFIG_NAME).is_file() else None
        rebuild_layout(model, state_dict, _recorded_config(path, entry) or config, spec=spec)
        _load_checked(model, state_dict, path, hint)
        return model.train(training)
    if layout is None:
        if is_reconfigured(model):
            raise ValueError(
                f"{str(path)!r} holds a plain model (saved before FAR's switch, or without FAR), and this model is "
                "reconfigured by FAR: loading one into the other would mix them. Resume from a checkpoint taken "
                "after the switch, or pass the plain model"
            )
        _load_checked(model, state_dict, path, hint)
        return model
    chosen, recorded = layout
    if is_reconfigured(model):
        if not same_learners(model, chosen, spec):
            raise ValueError(
                f"this model is reconfigured with other learners than {str(path)!r} records; pass the plain model"
            )
        restore(model)
    _load_checked(model, state_dict, path, hint)
    return rebuild_from_learners(model, chosen, recorded, spec=spec).train(training)
