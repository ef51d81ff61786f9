"""Fine-tuning methods, one module each behind one interface (`far.methods.base.Method`).

`METHODS` is the one table of the `--method` names: a run looks its method up here and asks it
for its surgery, its options, what it does to the model and what it saves (see `Method`).

    >>> METHODS["far"].far_config(0.4)
    FARConfig(retention=0.4, selection='per_layer', ...)
"""

from __future__ import annotations

from far.methods.base import FreezeFFN, Method, Saved, Surgery
from far.methods.lora import Lora, LoraSettings

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("full", "full fine-tuning"),
        Surgery("far", "FAR: learners chosen by priming", selection="per_layer"),
        Surgery(
            "random",
            "FAR's surgery with learners drawn at random (the paper's baseline)",
            lean_ffn=None,
            selection="random",
        ),
        FreezeFFN("freeze-ffn", "every FFN weight frozen (an ablation)"),
        Lora("lora", "LoRA adapters (Hugging Face PEFT) on a frozen base, the task head trained"),
    )
}

__all__ = ["METHODS", "FreezeFFN", "Lora", "LoraSettings", "Method", "Saved", "Surgery"]
