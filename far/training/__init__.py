"""Training with FAR: one-call fine-tuning, MeZO, checkpoints, and a transformers.Trainer callback.

`far.finetune` and the lean causal-LM runs step through one loop, `far.training.engine`, each with a runner.

>>> result = far.finetune(model, train_examples, retention=0.4, optimizer="adamw")
>>> optimizer = far.MeZO(model.parameters(), lr=1e-6)      # zeroth-order, inference memory
>>> FARTrainer(..., callbacks=[far.FARCallback(retention=0.4)])   # folders load with plain transformers
"""

from __future__ import annotations

from far.lazy import lazy_face

# Names are imported on first use (PEP 562), so that a process that needs one part of far does not
# pay for the others: the lean LLM path must not import transformers' model code or datasets.
lazy_face(
    __name__,
    {
        "far.training.callback": ("FARCallback", "retarget_optimizer"),
        "far.training.trainer": ("FARTrainer", "FARTrainerMixin"),
        "far.training.distributed": ("Parallel",),
        "far.training.finetune": ("finetune",),
        "far.training.gradient_priming": ("ffn_parameter_names", "gradient_scores", "prime_and_reconfigure"),
        "far.training.memory": ("page_out_after_forward", "release_freed_memory", "to_private_memory"),
        "far.training.mezo": ("MeZO",),
        "far.training.prime": ("prime_layout",),
        "far.training.result": ("FinetuneResult",),
        "far.training.schedule": ("WarmupLinear", "warmup_linear"),
    },
)
