"""FAR: Freeze And Reconfigure — fine-tune only the FFN nodes that matter.

>>> import far
>>> primer = far.Primer(model)          # 1. snapshot the FFNs, then train ~10% of the steps
>>> far.reconfigure(model, retention=0.4)  # 2-3. select learners, split every FFN
>>> far.summary(model)                  # what is trainable now
>>> far.restore(model)                  # an ordinary Hugging Face model again
"""

from __future__ import annotations

from far.lazy import lazy_face

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
lazy_face(
    __name__,
    {
        "far.architectures": (
            "AttentionSpec",
            "BUILTIN_ATTENTION_SPECS",
            "BUILTIN_SPECS",
            "find_attention",
            "FFN",
            "FFNSpec",
            "find_ffns",
        ),
        "far.config": ("FARConfig",),
        "far.freezing": ("freeze_layers",),
        "far.layers": ("SplitLinear",),
        "far.priming": ("Primer",),
        "far.saving": ("from_pretrained", "save_learners", "save_pretrained"),
        "far.learners_swap": ("load_learners", "unload_learners"),
        "far.selection": ("select_learners",),
        "far.summary": ("Summary", "summary"),
        "far.surgery.reconfigure": ("freeze_ffns", "reconfigure", "restore"),
        "far.surgery.state": ("get_config", "is_reconfigured", "learners"),
        "far.training": ("FARCallback", "FARTrainer", "FinetuneResult", "MeZO", "finetune"),
    },
)

__version__ = "0.1.0"
