"""`FARCallback`: priming → reconfigure inside a `transformers.Trainer` run, and what it reports."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import nn
from torch.optim import Optimizer
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from far.architectures import FFNSpec
from far.config import UNSET, FARConfig, as_config
from far.priming import Primer, primer_of
from far.saving.layout import LAYOUT_FILE, read_layout, rebuild_layout
from far.saving.pretrained import has_far_layout
from far.saving.stock import weight_files
from far.selection import needs_scores
from far.summary import Summary, summary
from far.surgery.reconfigure import reconfigure
from far.surgery.state import get_config, is_reconfigured
from far.training.options import check_length
from far.training.plan import length_in_steps

# A child of the Trainer's own logger: its level (--log_level, transformers' verbosity) and handler
# apply, so what FAR does shows where the Trainer reports its run.
logger = logging.getLogger("transformers.trainer.far")

# How to train FAR under DDP, said wherever a run cannot do it as asked.
DDP_RECIPE = (
    "prime in one process with FARCallback(..., stop_at_switch=True) under far.training.trainer.FARTrainer (the run "
    "saves a checkpoint at the switch and stops), then train on under torchrun with "
    "resume_from_checkpoint=<that checkpoint> and the same callback; see docs/trainer.md"
)


def retarget_optimizer(optimizer: Optimizer, model: nn.Module, group_of: dict[str, int]) -> None:
    """Point an existing optimizer at the model's trainable tensors after surgery, in place.

    Tensors that left the model or stopped being trainable leave their group and their state is
    dropped; each new tensor (`<m>.learner_weight`, `<m>.learner_bias`) joins the group of the
    tensor it came from (`<m>.weight`, `<m>.bias`, per `group_of`: name -> group index before the
    surgery), with fresh state. Groups keep their number and hyperparameters, so a scheduler built
    on the optimizer keeps working, and each group lists its tensors in the model's order, as
    `Trainer.create_optimizer` would for the reconfigured model (so Trainer checkpoints resume).
    """
    order = {id(p): i for i, (_, p) in enumerate(model.named_parameters())}
    trainable = {id(p): (name, p) for name, p in model.named_parameters() if p.requires_grad}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in trainable:
                optimizer.state.pop(p, None)
        group["params"] = [p for p in group["params"] if id(p) in trainable]
    placed = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for pid, (name, p) in trainable.items():
        if pid in placed:
            continue
        origin = name.replace(".learner_weight", ".weight").replace(".learner_bias", ".bias")
        if origin not in group_of:
            raise RuntimeError(
                f"the trainable tensor {name!r} has no source tensor in the optimizer; build a new optimizer"
            )
        optimizer.param_groups[group_of[origin]]["params"].append(p)
    for group in optimizer.param_groups:
        group["params"].sort(key=lambda p: order[id(p)])


class FARCallback(TrainerCallback):
    """Prime, then reconfigure, inside a `transformers.Trainer` run.

    The first `priming` optimizer steps of the run train the whole model while a `far.Primer`
    watches its FFNs. At the end of the last of them (the *switch*) the callback calls
    `far.reconfigure` and points the Trainer's own optimizer at the new trainable tensors, in place
    (`retarget_optimizer`): frozen tensors leave it with their state, learners join the groups of
    the weights they came from with fresh state. The learning-rate schedule runs on unchanged.
    Priming's weight changes are kept. The model stays reconfigured after training.

    It reports what it does, in the Trainer's log (`logger.info`) and in `state.log_history`: the
    priming length at the start (`far_priming_steps`), and at the switch the learners per layer
    and the trainable parameters (`far_switch_step`, `far_learners`, `far_trainable_parameters`).
    The best model (`load_best_model_at_end`) is chosen among evaluations after the switch: the
    primed plain model is not a FAR model, and its checkpoints never load into the reconfigured one.

    Use it with `far.training.trainer.FARTrainer` (or `FARTrainerMixin` on your own Trainer class):
    its folders are plain Hugging Face models with the FAR layout beside them, and it resumes from
    any checkpoint, during priming or after the switch. A plain `Trainer` saves the split layers
    as they are, which plain transformers cannot load (the callback warns).

    DDP cannot follow the switch (its reducer is bound to the parameters it wrapped): prime in one
    process with `stop_at_switch=True`, then train on under torchrun from the checkpoint taken at
    the switch (docs/trainer.md).

    Args:
        config: The `far.FARConfig` of the surgery; or leave it out and give its fields as
            keywords, as for `far.reconfigure`.
        priming: Priming length: a fraction of the Trainer's `max_steps` in [0, 1), or a number of
            optimizer steps. Ignored with selection="random" (no scores needed: the surgery is at
            the start).
        spec: As for `far.reconfigure`.
        stop_at_switch: End the run right after the switch, with a checkpoint there: the first
            half of the DDP recipe. A run resumed after the switch is not affected.
        **fields: The config's fields (retention, selection, seed, freeze_embeddings) as keywords.

    Example:
        >>> from far.training.trainer import FARTrainer
        >>> callback = far.FARCallback(far.FARConfig(retention=0.4), priming=0.1)
        >>> trainer = FARTrainer(model=model, args=args, train_dataset=train, callbacks=[callback])
        >>> trainer.train()                     # or resume_from_checkpoint=True, from any checkpoint
        >>> trainer.save_model("out/final")     # AutoModelForSequenceClassification.from_pretrained loads it
    """

    def __init__(
        self,
        config: FARConfig | float = UNSET,
        *,
        priming: float | int = 0.1,
        spec: FFNSpec | None = None,
        stop_at_switch: bool = False,
        **fields: object,
    ) -> None:
        self.config = as_config(config, **fields)
        self.priming = check_length("priming", priming)
        self._needs_scores = needs_scores(self.config)
        if self._needs_scores and self.priming == 0:
            raise ValueError(
                f"selection={self.config.selection!r} needs priming scores: priming must be > 0, or use "
                "selection='random'"
            )
        if not isinstance(stop_at_switch, bool):
            raise TypeError(f"stop_at_switch must be True or False, got {stop_at_switch!r}")
        if stop_at_switch and not self._needs_scores:
            raise ValueError(
                "stop_at_switch=True stops after priming, and selection='random' does not prime; under DDP, "
                "call far.reconfigure(model, config) before building the Trainer instead (every process draws the "
                "same seeded learners)"
            )
        self.spec = spec
        self.stop_at_switch = stop_at_switch
        self.priming_steps: int | None = None
        self._primer: Primer | None = None
        self._warned_split_checkpoint = False

    def make_primer(self, model: nn.Module) -> Primer:
        """A `far.Primer` on `model` that records what this callback's surgery needs.

        It attaches itself to `model` (`model.far_primer`). `FARTrainer` calls it to resume
        priming, and loads the snapshot saved with the checkpoint into it.
        """
        return Primer(
            model,
            self.spec,
            heads=self.config.attention_retention is not None,
            # What will be frozen whole goes back to its pre-priming value: the embeddings, or with depth
            # whole layers and all below.
            embeddings=self.config.freeze_embeddings,
            everything=self.config.freeze_layers is not None,
        )

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        **kwargs,
    ) -> None:
        needs = self._needs_scores
        self.priming_steps = length_in_steps("priming", self.priming, state.max_steps) if needs else 0
        self._primer = None
        step = state.global_step
        if is_reconfigured(model):
            if step < self.priming_steps:
                raise ValueError(
                    "the model is already reconfigured by FAR, but this run has not primed yet; pass the plain model"
                )
            counts = summary(model, verbose=False)
            if step == 0:  # reconfigured before the Trainer (selection="random" needs no priming)
                logger.info("FAR: the model is reconfigured already; it trains as it is\n%s", counts)
            else:
                logger.info(
                    "FAR: resumed at step %d, after the switch at step %d\n%s", step, self.priming_steps, counts
                )
            return
        if args.world_size > 1:
            raise RuntimeError(
                f"FARCallback changes the model's parameters at the switch, which DDP ({args.world_size} processes) "
                f"cannot follow: its reducer is bound to the parameters it wrapped. {DDP_RECIPE}"
            )
        if step > 0 and step >= self.priming_steps:
            raise ValueError(
                f"this run resumes at step {step}, after FAR's switch at step {self.priming_steps}, but the model is "
                "plain: the checkpoint's FAR layout was not loaded. Resume with far.training.trainer.FARTrainer, "
                "which loads the weights and rebuilds the layout before the optimizer is made"
            )
        if step > 0:
            self._primer = primer_of(model)
            if self._primer is None:
                raise ValueError(
                    f"this run resumes at step {step}, inside priming ({self.priming_steps} steps), without the "
                    "Primer's snapshot of the pre-priming weights. Resume with far.training.trainer.FARTrainer, which "
                    "saves the snapshot with every checkpoint taken during priming and loads it back"
                )
            logger.info("FAR: resumed inside priming, at step %d of %d", step, self.priming_steps)
            return
        if self.priming_steps == 0:
            self._switch(state, model, optimizer, None)
            return
        self._primer = self.make_primer(model)
        logger.info(
            "FAR: priming: the first %d of %d optimizer steps train the whole model, then %s",
            self.priming_steps,
            state.max_steps,
            self.config,
        )
        self._log(state, {"far_priming_steps": self.priming_steps, "far_max_steps": state.max_steps})

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        # The Trainer passes its model and optimizer (and more) as keywords.
        if self._primer is not None and state.global_step >= self.priming_steps:
            scores = self._primer.scores()
            head_scores = self._primer.head_scores() if self._primer.watches_heads else None
            self._primer = None
            model = kwargs["model"]
            self._switch(state, model, kwargs["optimizer"], scores, head_scores)
            if state.best_metric is not None or state.best_model_checkpoint is not None:
                logger.info("FAR: the best model is now chosen among evaluations after the switch")
            # The primed plain model is not a FAR model: its checkpoints never become the best one.
            state.best_metric = state.best_global_step = state.best_model_checkpoint = None
            if self.stop_at_switch:
                logger.info("FAR: stop_at_switch: saving a checkpoint at step %d and stopping", state.global_step)
                control.should_save = True
                control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self._warned_split_checkpoint or not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        files = weight_files(folder)
        if files and has_far_layout(files):
            self._warned_split_checkpoint = True
            logger.warning(
                "FAR: %s holds FAR's split layers (learner_weight, frozen_weight, node_order): plain transformers "
                "loads it as a broken model, and it resumes only through restore_layout. Use "
                "far.training.trainer.FARTrainer: it saves plain Hugging Face models with the FAR layout beside them",
                folder,
            )

    def _switch(
        self,
        state: TrainerState,
        model: nn.Module,
        optimizer: Optimizer,
        scores: dict[str, torch.Tensor] | None,
        head_scores: dict[str, torch.Tensor] | None = None,
    ) -> None:
        index = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
        group_of = {name: index[id(p)] for name, p in model.named_parameters() if id(p) in index}
        reconfigure(model, self.config, scores=scores, head_scores=head_scores, spec=self.spec)
        retarget_optimizer(optimizer, model, group_of)
        counts = summary(model, verbose=False)
        logger.info(
            "FAR: reconfigured at step %d of %d (%s); the Trainer's count of trainable parameters above was taken "
            "before this\n%s",
            state.global_step,
            state.max_steps,
            get_config(model),
            counts,
        )
        self._log(state, switch_record(state.global_step, counts))

    @staticmethod
    def _log(state: TrainerState, record: dict) -> None:
        if state.epoch is not None:
            record = {**record, "epoch": state.epoch}
        state.log_history.append({**record, "step": state.global_step})

    def restore_layout(self, model: nn.Module, checkpoint: str | os.PathLike) -> nn.Module:
        """Rebuild, on the plain `model`, the FAR layout of a plain `Trainer`'s checkpoint taken after the switch.

        A plain `transformers.Trainer` saves the split layers as they are; call this before
        `trainer.train(resume_from_checkpoint=checkpoint)` so that it can load them. `FARTrainer`
        needs none of this: it resumes from any of its checkpoints by itself.
        """
        folder = Path(checkpoint)
        if (folder / LAYOUT_FILE).is_file():
            raise ValueError(
                f"{str(checkpoint)!r} was saved by FARTrainer (plain weights, the FAR layout beside them): resume it "
                "with FARTrainer, which loads the weights and then rebuilds the layout; a plain Trainer would skip "
                "the FFN weights of a model split beforehand"
            )
        path = folder / "model.safetensors"
        if not path.is_file():
            raise ValueError(f"no model.safetensors in {str(checkpoint)!r}; pass a Trainer checkpoint folder")
        tensors = read_layout([path])
        if not tensors:
            raise ValueError(
                f"{str(checkpoint)!r} holds a plain model (taken during priming): there is no layout to restore. "
                "Resume it with far.training.trainer.FARTrainer, which saves the Primer's snapshot with it"
            )
        return rebuild_layout(model, tensors, self.config, spec=self.spec)


def switch_record(step: int, counts: Summary) -> dict:
    """What `state.log_history` records of the switch: its step, the learners per layer and the parameter counts."""
    return {
        "far_switch_step": step,
        "far_trainable_parameters": counts.trainable_parameters,
        "far_total_parameters": counts.total_parameters,
        "far_trainable_percent": round(100 * counts.trainable_fraction, 4),
        "far_learners": {name: list(kn) for name, kn in counts.learners.items()},
    }
