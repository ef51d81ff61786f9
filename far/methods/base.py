"""The interface every fine-tuning method of a training run follows, and the plain methods.

A method is one row of `far.methods.METHODS`, reached by its `--method` name. A run asks it four
things, always in this order, and never branches on the method's name itself:

    far_config(...)   the surgery `far.finetune` makes (a `far.FARConfig`), or None
    freezes_ffn, lean_ffn, wraps_model   what the runs ask of it, so that none branches on its name
    apply(model, ..)  what it does to the model before training (LoRA wraps it), and a record
    save(model, ..)   the files it writes after training, and their sizes

`Method` itself is full fine-tuning; FAR's surgery (`Surgery`), the FFN-freezing ablation and LoRA
(`far.methods.lora`) override what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

import far
from far.config import FARConfig
from far.saving.safetensors_file import LEARNERS_FILE
from far.training.options import check_plain_depth


@dataclass
class Saved:
    """What `Method.save` wrote: file names for the run's record (relative to its folder, or paths), and sizes."""

    files: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


def model_bytes(model: nn.Module) -> int:
    """The whole model's weights (parameters, tied ones once): what a small per-user file spares storing."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_model(model: nn.Module, tokenizer: Any, directory: Path) -> Path:
    """Save the fine-tuned model with `far.save_pretrained` (FAR layout kept) and the tokenizer beside it."""
    far.save_pretrained(model, directory)
    tokenizer.save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class Method:
    """One way to fine-tune; this base class is full fine-tuning (every weight trains)."""

    name: str  # the --method value
    help: str  # one line for the help text
    # What of the FFNs a GGUF causal LM trains under this method, in the lean runtime's words
    # (`far.llm.lean_far.set_trainable`); None: the lean causal-LM runtime does not run the method.
    lean_ffn: str | None = "all"
    # Whether the method wraps the model in another library's modules (PEFT), which far's lean runtimes,
    # running their own plain-torch copy of a model, cannot do.
    wraps_model: bool = False
    # Whether every FFN weight stays frozen (the freeze-FFN ablation of full fine-tuning).
    freezes_ffn: bool = False
    # How FAR's surgery picks learners (`far.FARConfig.selection`); None: the method makes no surgery.
    selection: str | None = None

    def far_config(
        self,
        retention: float,
        *,
        seed: int = 0,
        freeze_embeddings: bool = False,
        attention_retention: float | None = None,
        freeze_layers: int | str | None = None,
    ) -> FARConfig | None:
        """The surgery of this method, checked by `FARConfig`; None for a method without one.

        Without surgery, `freeze_layers` is plain freezing (`far.freeze_layers`), which needs a number:
        "auto" reads FAR's priming scores.
        """
        if self.selection is not None:
            return FARConfig(
                retention,
                self.selection,
                seed=seed,
                freeze_embeddings=freeze_embeddings,
                attention_retention=attention_retention,
                freeze_layers=freeze_layers,
            )
        check_plain_depth(freeze_layers)
        if attention_retention is not None:
            raise ValueError(f"attention_retention splits heads with FAR's surgery; method {self.name!r} has none")
        return None

    def apply(self, model: nn.Module, *, base_model: str, lora: Any = None) -> tuple[nn.Module, dict]:
        """The model to train (the same one, or a wrapper of it) and fields for the run's record."""
        return model, {}

    def save(
        self,
        model: nn.Module,
        tokenizer: Any,
        output_dir: Path,
        model_dir: Path,
        *,
        learners_metadata: Mapping[str, str] | None = None,
    ) -> Saved:
        """Write the trained model to `model_dir` (and, for a reconfigured model, its learners file, with
        `learners_metadata` in its metadata: the shared layout the run trained with)."""
        save_model(model, tokenizer, model_dir)
        saved = Saved(files={"model": str(model_dir)})
        if far.is_reconfigured(model):
            learners = far.save_learners(model, output_dir / LEARNERS_FILE, metadata=learners_metadata)
            saved.files["learners"] = LEARNERS_FILE
            saved.sizes.update(learners_file_bytes=learners.stat().st_size, model_bytes=model_bytes(model))
        return saved


@dataclass(frozen=True)
class FreezeFFN(Method):
    """Every FFN weight frozen, the rest trained: the paper's ablation."""

    lean_ffn: str | None = "none"
    freezes_ffn: bool = True


@dataclass(frozen=True)
class Surgery(Method):
    """FAR: split every FFN, keeping `retention` of its nodes trainable, chosen by `selection` (priming's
    scores, or at random: the paper's baseline)."""

    lean_ffn: str | None = "learners"
    selection: str | None = "per_layer"
