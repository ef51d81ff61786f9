"""Training with FAR: one-call fine-tuning, MeZO, checkpoints, and a transformers.Trainer callback.

>>> result = far.finetune(model, train_examples, retention=0.4, optimizer="adamw")
>>> optimizer = far.MeZO(model.parameters(), lr=1e-6)      # zeroth-order, inference memory
>>> Trainer(..., callbacks=[far.FARCallback(retention=0.4)])
"""

from far.training.callback import FARCallback, retarget_optimizer
from far.training.finetune import finetune
from far.training.mezo import MeZO
from far.training.result import FinetuneResult
from far.training.schedule import WarmupLinear, warmup_linear

__all__ = ["FARCallback", "FinetuneResult", "MeZO", "WarmupLinear", "finetune", "retarget_optimizer", "warmup_linear"]
