"""FAR: Freeze And Reconfigure — fine-tune only the FFN nodes that matter.

>>> import far
>>> primer = far.Primer(model)          # 1. snapshot the FFNs, then train ~10% of the steps
>>> far.reconfigure(model, retention=0.4)  # 2-3. select learners, split every FFN
>>> far.summary(model)                  # what is trainable now
>>> far.restore(model)                  # an ordinary Hugging Face model again
"""

from __future__ import annotations

from far.lazy import lazy_names

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
_LAZY = {
    "AttentionSpec": "far.architectures",
    "BUILTIN_ATTENTION_SPECS": "far.architectures",
    "BUILTIN_SPECS": "far.architectures",
    "find_attention": "far.architectures",
    "FFN": "far.architectures",
    "FFNSpec": "far.architectures",
    "find_ffns": "far.architectures",
    "FARConfig": "far.config",
    "freeze_layers": "far.freezing",
    "SplitLinear": "far.layers",
    "Primer": "far.priming",
    "from_pretrained": "far.saving",
    "load_learners": "far.learners_swap",
    "save_learners": "far.saving",
    "save_pretrained": "far.saving",
    "unload_learners": "far.learners_swap",
    "select_learners": "far.selection",
    "Summary": "far.summary",
    "summary": "far.summary",
    "freeze_ffns": "far.surgery.reconfigure",
    "get_config": "far.surgery.state",
    "is_reconfigured": "far.surgery.state",
    "learners": "far.surgery.state",
    "reconfigure": "far.surgery.reconfigure",
    "restore": "far.surgery.reconfigure",
    "FARCallback": "far.training",
    "FARTrainer": "far.training",
    "FinetuneResult": "far.training",
    "MeZO": "far.training",
    "finetune": "far.training",
}

__version__ = "0.1.0"

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
