"""Training with FAR: one-call fine-tuning, MeZO, checkpoints, and a transformers.Trainer callback.

`far.finetune` and the lean causal-LM runs step through one loop, `far.training.engine`, each with a runner.

>>> result = far.finetune(model, train_examples, retention=0.4, optimizer="adamw")
>>> optimizer = far.MeZO(model.parameters(), lr=1e-6)      # zeroth-order, inference memory
>>> FARTrainer(..., callbacks=[far.FARCallback(retention=0.4)])   # folders load with plain transformers
"""

from __future__ import annotations

from far.lazy import lazy_names

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
_LAZY = {
    "FARCallback": "far.training.callback",
    "FARTrainer": "far.training.trainer",
    "FARTrainerMixin": "far.training.trainer",
    "retarget_optimizer": "far.training.callback",
    "finetune": "far.training.finetune",
    "ffn_parameter_names": "far.training.gradient_priming",
    "gradient_scores": "far.training.gradient_priming",
    "prime_and_reconfigure": "far.training.gradient_priming",
    "page_out_after_forward": "far.training.memory",
    "release_freed_memory": "far.training.memory",
    "to_private_memory": "far.training.memory",
    "MeZO": "far.training.mezo",
    "FinetuneResult": "far.training.result",
    "WarmupLinear": "far.training.schedule",
    "warmup_linear": "far.training.schedule",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
