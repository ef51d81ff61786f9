"""`FARCallback`: priming → reconfigure inside a `transformers.Trainer` run."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.optim import Optimizer
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from far.architectures import FFNSpec
from far.config import AUTO, UNSET, FARConfig, as_config
from far.priming import Primer
from far.saving.layout import read_layout, rebuild_layout
from far.surgery.reconfigure import reconfigure
from far.surgery.state import is_reconfigured
from far.training.options import check_length
from far.training.plan import length_in_steps


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
    placed: set[int] = set()
    for group in optimizer.param_groups:
        kept = []
        for p in group["params"]:
            if id(p) in trainable:
                kept.append(p)
                placed.add(id(p))
            else:
                optimizer.state.pop(p, None)
        group["params"] = kept
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
    watches its FFNs. At the end of the last of them the callback calls `far.reconfigure` and
    points the Trainer's own optimizer at the new trainable tensors, in place (`retarget_optimizer`):
    frozen tensors leave it with their state, learners join the groups of the weights they came
    from with fresh state. The learning-rate schedule runs on unchanged. Priming's weight changes
    are kept. The model stays reconfigured after training.

    Not for DDP runs: DDP's reducer is bound to the parameters it wrapped. There, prime and
    reconfigure first (e.g. `far.finetune(..., max_steps=priming)` or this callback in a
    single-process run), then train the reconfigured model under DDP.

    Args:
        config: The `far.FARConfig` of the surgery; or leave it out and give its fields as
            keywords, as for `far.reconfigure`.
        priming: Priming length: a fraction of the Trainer's `max_steps` in [0, 1), or a number of
            optimizer steps. Ignored with selection="random" (no scores needed: the surgery is at
            the start).
        spec: As for `far.reconfigure`.
        **fields: The config's fields (retention, selection, seed, freeze_embeddings) as keywords.

    Example:
        >>> callback = far.FARCallback(far.FARConfig(retention=0.4), priming=0.1)
        >>> trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[callback])
        >>> trainer.train()
        >>> # resuming past the switch: rebuild the layout before the Trainer loads the weights
        >>> callback.restore_layout(model, "out/checkpoint-500")
        >>> trainer.train(resume_from_checkpoint="out/checkpoint-500")
    """

    def __init__(
        self,
        config: FARConfig | float = UNSET,
        *,
        priming: float | int = 0.1,
        spec: FFNSpec | None = None,
        **fields: object,
    ) -> None:
        self.config = as_config(config, **fields)
        self.priming = check_length("priming", priming)
        # Random selection needs no scores, unless freeze_layers="auto" reads them to choose the depth.
        self._needs_scores = self.config.selection != "random" or self.config.freeze_layers == AUTO
        if self._needs_scores and self.priming == 0:
            raise ValueError(
                f"selection={self.config.selection!r} needs priming scores: priming must be > 0, or use "
                "selection='random'"
            )
        self.spec = spec
        self.priming_steps: int | None = None
        self._primer: Primer | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        **kwargs,
    ) -> None:
        if args.world_size > 1:
            raise RuntimeError(
                "FARCallback changes the model's parameters mid-run, which DDP cannot follow; prime and reconfigure "
                "in one process, then train the reconfigured model under DDP"
            )
        needs = self._needs_scores
        self.priming_steps = length_in_steps("priming", self.priming, state.max_steps) if needs else 0
        if is_reconfigured(model):
            if state.global_step < self.priming_steps:
                raise ValueError(
                    "the model is already reconfigured by FAR, but this run has not primed yet; pass the plain model"
                )
            return  # resumed after the switch: restore_layout() rebuilt it
        if state.global_step > 0 and self.priming_steps:
            raise ValueError(
                "cannot resume a FARCallback run inside priming (the Primer's snapshot of the FFNs is not in Trainer "
                "checkpoints); resume from a checkpoint after the switch, or start over"
            )
        if self.priming_steps == 0:
            self._switch(model, optimizer, None)
        else:
            self._primer = Primer(
                model,
                self.spec,
                heads=self.config.attention_retention is not None,
                # What will be frozen whole goes back to its pre-priming value: the embeddings, or with depth
                # whole layers and all below.
                embeddings=self.config.freeze_embeddings,
                everything=self.config.freeze_layers is not None,
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        # The Trainer passes its model and optimizer (and more) as keywords.
        if self._primer is not None and state.global_step >= self.priming_steps:
            scores = self._primer.scores()
            head_scores = self._primer.head_scores() if self._primer.watches_heads else None
            self._primer = None
            self._switch(kwargs["model"], kwargs["optimizer"], scores, head_scores)

    def _switch(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        scores: dict[str, torch.Tensor] | None,
        head_scores: dict[str, torch.Tensor] | None = None,
    ) -> None:
        index = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
        group_of = {name: index[id(p)] for name, p in model.named_parameters() if id(p) in index}
        reconfigure(model, self.config, scores=scores, head_scores=head_scores, spec=self.spec)
        retarget_optimizer(optimizer, model, group_of)

    def restore_layout(self, model: nn.Module, checkpoint: str | os.PathLike) -> nn.Module:
        """Rebuild, on the plain `model`, the FAR layout saved in a Trainer checkpoint folder.

        Call it before `trainer.train(resume_from_checkpoint=checkpoint)` for a checkpoint taken
        after the switch, so that the Trainer can load the saved weights into the same layout.
        """
        path = Path(checkpoint) / "model.safetensors"
        if not path.is_file():
            raise ValueError(f"no model.safetensors in {str(checkpoint)!r}; pass a Trainer checkpoint folder")
        return rebuild_layout(model, read_layout([path]), self.config, spec=self.spec)
