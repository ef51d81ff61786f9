"""The lean encoder runtime: BERT in plain torch, for fine-tuning within a tight memory budget.

Only transformers' config classes are imported (its model code costs more resident memory than the
weights: docs/design.md, "Resident memory"); names are transformers', so FAR's surgery, learners files
and checkpoints work unchanged, and `save_pretrained` writes a folder transformers loads.

    >>> from far.encoder import from_pretrained, save_pretrained
    >>> model = from_pretrained(folder, "classification", num_labels=2)
    >>> model.gradient_checkpointing_enable()
"""

from __future__ import annotations

from far.lazy import lazy_face

# On first use (PEP 562): `far.models` names this package for its lean runtime, and a process that never
# loads a lean model (the causal-LM runtime's, say) must not import transformers for it.
lazy_face(
    __name__,
    {
        "far.encoder.bert": ("LeanBertModel",),
        "far.encoder.heads": ("LeanBertForQuestionAnswering", "LeanBertForSequenceClassification"),
        "far.encoder.loading": ("from_pretrained", "save_pretrained"),
        "far.encoder.tasks": ("TASK_KINDS", "task_overrides"),
    },
)
