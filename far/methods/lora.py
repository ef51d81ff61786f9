"""LoRA through Hugging Face PEFT: the `--method lora` runs, their two saved forms, and loading them back.

`add_lora` wraps a task model with `peft.get_peft_model` (the base frozen, the fresh task head trained
whole), `far.finetune` trains what is trainable, and `save_lora` writes what a PEFT user expects:

    adapter/   adapter_config.json + adapter_model.safetensors (PEFT's own files: the adapters and the
               head), plus the task model's config.json and the tokenizer, so the folder says what it is
    model/     the adapters merged into the base (`merge_and_unload`): a plain Hugging Face model

PEFT is imported only when a LoRA function runs, so `import far` and `import far.recipes` work without it.

    >>> model = add_lora(model, LoraSettings(r=8))
    >>> far.finetune(model, train, config=None)
    >>> save_lora(model, tokenizer, adapter_dir="runs/cola/adapter", model_dir="runs/cola/model")
    >>> model = load_lora_adapter("runs/cola/adapter", base_path)   # merged, ready to evaluate
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

import far
from far.methods.base import Method, Saved, model_bytes
from far.storage.atomic import atomic_dir

PEFT_REQUIREMENT = "peft>=0.21,<0.22"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# The config key naming what base model the adapter was trained on, as the user gave it (an alias stays an alias).
BASE_MODEL_KEY = "far_lora_base_model"

# Head class-name suffix -> (PEFT task type, the transformers Auto class that rebuilds the base). PEFT's
# task type decides which fresh head it trains whole beside the adapters (classifier/score, qa_outputs).
# The Auto classes are named, not imported: the lean LLM path imports this module and must not pay for
# transformers' model registry.
_TASK_TYPES = {
    "ForSequenceClassification": ("SEQ_CLS", "AutoModelForSequenceClassification"),
    "ForQuestionAnswering": ("QUESTION_ANS", "AutoModelForQuestionAnswering"),
    "ForCausalLM": ("CAUSAL_LM", "AutoModelForCausalLM"),
}


def _peft() -> Any:
    try:
        import peft
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"--method lora needs Hugging Face PEFT; install it with: pip install '{PEFT_REQUIREMENT}'"
        ) from None
    return peft


@dataclass(frozen=True)
class LoraSettings:
    """LoRA's options, with PEFT's defaults (`peft.LoraConfig`): the update is scaled by alpha / r;
    `target_modules` None takes PEFT's table for the architecture (BERT: query and value)."""

    r: int = 8
    alpha: int = 8
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora rank r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if self.target_modules is not None and not self.target_modules:
            raise ValueError("lora target_modules must name at least one module, or be None for PEFT's default")


def _task_type(model: nn.Module) -> str:
    name = type(model).__name__
    for suffix, (task_type, _) in _TASK_TYPES.items():
        if name.endswith(suffix):
            return task_type
    raise ValueError(f"--method lora knows the heads {', '.join(_TASK_TYPES)}; {name} is none of them")


def _check_targets(model: nn.Module, targets: tuple[str, ...] | None) -> None:
    # PEFT matches a target by a module's full name or its last parts; say what there is before it fails.
    if targets is None:
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"lora target modules {', '.join(missing)} are not modules of this {type(model).__name__}; "
            f"its linear layers are named: {', '.join(linear)}"
        )


def lora_record(model: nn.Module) -> dict:
    """The LoRA options of a model wrapped by `add_lora`, for a run's record."""
    config = model.peft_config["default"]
    return dict(
        r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout, target_modules=sorted(config.target_modules)
    )


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is wrapped by PEFT (without importing PEFT when it is not)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def add_lora(model: nn.Module, settings: LoraSettings, *, base_model: str | None = None) -> nn.Module:
    """Wrap `model` with LoRA adapters (`peft.get_peft_model`): only the adapters and the task head train.

    Returns the `peft.PeftModel`; `model` itself is changed in place. `base_model` (the name the base was
    loaded by) is recorded in its config for loading the adapter back.
    """
    peft = _peft()
    task_type = _task_type(model)
    _check_targets(model, settings.target_modules)
    config = peft.LoraConfig(
        task_type=task_type,
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules) if settings.target_modules else None,
    )
    if base_model is not None:
        setattr(model.config, BASE_MODEL_KEY, base_model)
    return peft.get_peft_model(model, config)


def save_lora(
    model: nn.Module,
    tokenizer: Any,
    *,
    adapter_dir: str | os.PathLike,
    model_dir: str | os.PathLike | None = None,
) -> dict[str, Path]:
    """Save a LoRA model's adapter folder and, if `model_dir` is given, the merged plain model:
    {"adapter": folder, "model": folder}. Merging changes the model in place (`merge_and_unload`): call this last.
    The adapter folder is PEFT's (`PeftModel.from_pretrained` reads it) plus the task model's config and tokenizer.
    """
    if not is_lora(model):
        raise ValueError("save_lora needs a model wrapped by add_lora (a peft.PeftModel)")
    task_model = model.get_base_model()
    # The config names the head class, which load_lora_adapter rebuilds the base with.
    task_model.config.architectures = [type(task_model).__name__]
    with atomic_dir(adapter_dir) as tmp:
        model.save_pretrained(tmp)
        task_model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    saved = {"adapter": Path(adapter_dir)}
    if model_dir is not None:
        merged = model.merge_and_unload()
        far.save_pretrained(merged, model_dir)  # far's lazy name: importing far.saving here would load transformers
        tokenizer.save_pretrained(model_dir)
        saved["model"] = Path(model_dir)
    return saved


def is_adapter_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a PEFT adapter (adapter_config.json)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base_model(folder: str | os.PathLike) -> str:
    """The base model an adapter folder was trained on: as the run named it, else as PEFT recorded it."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    recorded = config.get(BASE_MODEL_KEY) or json.loads((folder / ADAPTER_CONFIG).read_text()).get(
        "base_model_name_or_path"
    )
    if not recorded:
        raise ValueError(f"the adapter in {folder} does not say which base model it was trained on")
    return recorded


def load_lora_adapter(folder: str | os.PathLike, base_path: str | os.PathLike, *, merge: bool = True) -> nn.Module:
    """An adapter folder (`save_lora`) loaded onto its base model (`base_path`, see `adapter_base_model`), in eval
    mode, merged into a plain model unless `merge` is False (then the `peft.PeftModel`)."""
    import transformers

    peft = _peft()
    config = transformers.AutoConfig.from_pretrained(folder)
    architecture = (config.architectures or [""])[0]
    auto_name = next((auto for suffix, (_, auto) in _TASK_TYPES.items() if architecture.endswith(suffix)), None)
    if auto_name is None:
        raise ValueError(f"the adapter in {folder} is for a {architecture or 'model'} head, which LoRA runs never make")
    auto_class = getattr(transformers, auto_name)
    # The head's weights come from the adapter file (PEFT's modules_to_save); the base's are a placeholder for it.
    base = auto_class.from_pretrained(base_path, config=config, ignore_mismatched_sizes=True)
    model = peft.PeftModel.from_pretrained(base, folder)
    model = model.merge_and_unload() if merge else model
    return model.eval()


ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class Lora(Method):
    """`--method lora`: PEFT's adapters on a frozen base, the task head trained; no FAR surgery."""

    lean_ffn: str | None = None
    wraps_model: bool = True

    def apply(self, model: nn.Module, *, base_model: str, lora: LoraSettings | None = None) -> tuple[nn.Module, dict]:
        # Wrapped before the run is built, so that a bad target module fails before any training.
        model = add_lora(model, lora or LoraSettings(), base_model=base_model)
        return model, {"lora": lora_record(model)}

    def save(self, model: nn.Module, tokenizer: Any, output_dir: Path, model_dir: Path, **_: Any) -> Saved:
        # No learners file, so nothing for Method.save's learners_metadata to go in.
        # The adapter first: saving the merged model merges the adapters into the base in place.
        saved = save_lora(model, tokenizer, adapter_dir=output_dir / ADAPTER_DIR, model_dir=model_dir)
        return Saved(
            files={"adapter": ADAPTER_DIR, "model": str(model_dir)},
            # The merged model's weights: what one adapter spares storing per task.
            sizes={
                "adapter_file_bytes": (saved["adapter"] / ADAPTER_WEIGHTS).stat().st_size,
                "model_bytes": model_bytes(model.get_base_model()),
            },
        )
