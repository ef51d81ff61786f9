"""`FARTrainer`: a `transformers.Trainer` whose folders are plain Hugging Face models, and that resumes FAR runs.

A reconfigured model's own state dict holds FAR's split layers, which plain transformers loads
as a broken model (FFNs freshly initialised). The Trainer routes every save, its checkpoints and
`save_model` alike, through one method, `_save(output_dir, state_dict)`, whose `state_dict`
argument exists to save other tensors than the model's own; and every load of a checkpoint
through `_load_from_checkpoint` (resume) and `_load_best_model` (`load_best_model_at_end`). The
mixin overrides those three and nothing else:

- saving a reconfigured model writes the merged tensors under the plain names
  (`far.saving.layout.merged_state_dict`: what `far.restore` gives, the live model untouched),
  then beside them far_layout.safetensors (learner indices and `FARConfig`) and
  learners.safetensors (`far.save_learners`, for the stock base); during priming, the Primer's
  snapshot of the pre-priming weights (far_primer.safetensors);
- loading goes through `far.saving.pretrained.load_folder`: plain weights, then the layout
  rebuilt, before the Trainer makes the optimizer (so the optimizer state of a checkpoint after
  the switch fits); a checkpoint from before the switch never loads into a reconfigured model;
- resuming inside priming hands the saved snapshot to the run's `far.FARCallback`.

A `TrainerCallback` alone cannot do this: `save_model` fires no callback event, and a resumed
run's weights and optimizer state are loaded before the first event (`on_train_begin`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Trainer

from far.priming import primer_of
from far.saving.layout import merged_state_dict
from far.saving.pretrained import is_far_folder, load_folder, remove_far_files, write_far_files
from far.storage.atomic import atomic_file
from far.surgery.state import is_reconfigured
from far.training.callback import FARCallback

logger = logging.getLogger("transformers.trainer.far")

PRIMER_FILE = "far_primer.safetensors"  # in a checkpoint taken during priming: the pre-priming weights


class FARTrainerMixin:
    """Makes a `transformers.Trainer` (sub)class save and load FAR models; put it first in the bases.

    Example:
        >>> class MyTrainer(FARTrainerMixin, Seq2SeqTrainer): ...
    """

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        model = self.model
        # FSDP and DeepSpeed hand over a gathered state dict of their own: saved as given.
        merged = state_dict is None and is_reconfigured(model)
        super()._save(output_dir, state_dict=merged_state_dict(model) if merged else state_dict)
        if not self.args.should_save:
            return
        folder = Path(output_dir if output_dir is not None else self.args.output_dir)
        remove_far_files(folder)  # a FAR folder saved plain again must not keep the old layout
        (folder / PRIMER_FILE).unlink(missing_ok=True)
        if merged:
            write_far_files(model, folder, spec=self._far_layout().get("spec"))
        primer = primer_of(model)
        if primer is not None:
            with atomic_file(folder / PRIMER_FILE) as tmp:
                save_file({k: t.contiguous() for k, t in primer.state().items()}, tmp)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        target = self.model if model is None else model
        if is_far_folder(resume_from_checkpoint) or is_reconfigured(target):
            logger.info("Loading model from %s, with its FAR layout.", resume_from_checkpoint)
            load_folder(target, resume_from_checkpoint, **self._far_layout())
        else:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        snapshot = Path(resume_from_checkpoint) / PRIMER_FILE
        if snapshot.is_file():
            callback = self._far_callback()
            if callback is None:
                logger.warning("%s was taken during FAR priming, but this Trainer has no FARCallback", snapshot.parent)
                return
            callback.make_primer(target).load_state(load_file(snapshot))

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if is_far_folder(best) or is_reconfigured(self.model):
            logger.info("Loading best model from %s (score: %s), with its FAR layout.", best, self.state.best_metric)
            load_folder(self.model, best, **self._far_layout())
        else:
            super()._load_best_model()

    def _far_callback(self) -> FARCallback | None:
        return next((cb for cb in self.callback_handler.callbacks if isinstance(cb, FARCallback)), None)

    def _far_layout(self) -> dict:
        # the FARCallback's surgery, as load_folder takes it (none without the callback)
        callback = self._far_callback()
        return {} if callback is None else {"config": callback.config, "spec": callback.spec}


class FARTrainer(FARTrainerMixin, Trainer):
    """A `transformers.Trainer` that saves FAR models as plain Hugging Face folders and resumes FAR runs.

    Everything else is the Trainer's own. With a `far.FARCallback` it primes, switches and
    resumes from any checkpoint (during priming or after the switch); a model reconfigured before
    the Trainer saves and resumes the same way.

    What a folder it saves holds, for a reconfigured model: the plain model (config.json,
    model.safetensors: `AutoModel*.from_pretrained` loads it, with the same predictions), the FAR
    layout (far_layout.safetensors: `far.from_pretrained` gives the reconfigured model back) and the
    learners file (learners.safetensors: `far.load_learners(stock_base, ...)`).

    Example:
        >>> trainer = FARTrainer(model=model, args=args, train_dataset=train,
        ...                      callbacks=[far.FARCallback(far.FARConfig(retention=0.4), priming=0.1)])
        >>> trainer.train(resume_from_checkpoint=True)  # from the last checkpoint, if any
        >>> trainer.save_model("out/final")
        >>> AutoModelForSequenceClassification.from_pretrained("out/final")  # the trained model, merged
    """
