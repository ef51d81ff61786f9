"""`TrainingPlan`: a run's checked options (`TrainOptions`) with its step counts worked out, before training."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from far.config import FARConfig
from far.training.options import DEFAULT_LR, TrainOptions, check_length

# Options that do not change the trajectory: a resumed run may change them.
_FREE_ON_RESUME = {"eval_every", "checkpoint_every", "keep_checkpoints", "log_every", "cache_frozen_mib"}
# What a checkpoint written before an option existed ran with.
_BEFORE_THE_OPTION = {
    "reset_frozen": False,
    "freeze_layers": None,
    "frozen_from_start": False,
    "cache_frozen": False,
    "gradient_priming_steps": 0,
    "group_by_length": False,
    "layout_digest": None,
}


def length_in_steps(name: str, value: float | int, total: int, what: str | None = None) -> int:
    """The steps that a length (see `check_length`; a fraction rounds up) makes of a run of `total` steps, refused
    unless shorter than the run.

    Example:
        >>> length_in_steps("priming", 0.1, 95), length_in_steps("priming", 5, 95), length_in_steps("warmup", 0.001, 10)
        (10, 5, 1)
    """
    length, what = check_length(name, value), what or name
    steps = length if isinstance(length, int) else math.ceil(length * total)
    if steps and steps >= total:
        raise ValueError(
            f"{name}={value!r} means {steps} steps of {what}, but the run has only {total} steps in all; "
            f"{what} must be shorter than the run: lower {name} or raise epochs / max_steps"
        )
    return steps


# The options a plan takes as they were asked for, read from them: `plan.seed` is `plan.options.seed`. Among them
# `freeze_layers` is plain freezing's depth (with a surgery, `far.freeze_layers`); `reset_frozen` puts frozen tensors
# back to their pre-priming values at the switch; `cache_frozen` keeps the frozen bottom's output per example
# (far.training.frozen_bottom); `group_by_length` batches similar lengths (far.training.batches.BatchStream).
ASKED = tuple(
    "optimizer freeze_ffn freeze_layers reset_frozen batch_size grad_accum weight_decay max_grad_norm seed mezo_eps "
    "mezo_directions eval_every checkpoint_every keep_checkpoints log_every cache_frozen cache_frozen_mib "
    "group_by_length".split()
)


@dataclass(frozen=True)
class TrainingPlan:
    """One `far.finetune` run's checked options (`options`, held whole) with what they resolve to.

    Steps count optimizer steps (each over `grad_accum` batches) from the start of priming; the
    priming steps are the first `priming_steps` of `total_steps`. The options that a run takes as
    asked (`ASKED`) are read from `options` (`plan.seed`); the fields here are what planning decides.
    """

    options: TrainOptions
    n_examples: int
    total_steps: int
    priming_steps: int
    warmup_steps: int
    lr: float
    priming_lr: float | None
    priming_optimizer: str | None  # None: no priming phase
    # The surgery: the options' config, or with `recompute_activations` on where a memory plan needs it.
    far: FARConfig | None  # None: no surgery (full fine-tuning, or the freeze-FFN ablation)
    # Forward passes under bf16 autocast: the precision chosen for the model's device (TrainOptions.precision_for).
    bf16: bool = False
    # What the FARConfig freezes up front (its embeddings, a fixed freeze_layers) is frozen from the first
    # priming step instead of at the surgery: see `TrainOptions.frozen_from_start` (and a memory plan's levers).
    frozen_from_start: bool = False
    # Gradient priming (TrainOptions.priming_scores="gradient"): the batches of this many first steps are
    # scored before step 0, without an update; priming_steps is then 0 and every step trains the split model.
    gradient_priming_steps: int = 0
    # The content sha256 of the shared layout the run splits the model with at step 0 (None: none).
    layout_digest: str | None = None

    def __getattr__(self, name: str) -> object:
        # Only called for names that are not the plan's own: the options asked for as they are.
        if name in ASKED:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def freeze_embeddings(self) -> bool:
        """Whether the embeddings are frozen, by the surgery or plainly (`TrainOptions.embeddings_frozen`)."""
        return self.options.embeddings_frozen

    def optimizer_at(self, step: int) -> str:
        """The optimizer that takes step `step` (0-based)."""
        return self.priming_optimizer if step < self.priming_steps else self.optimizer

    def lr_at(self, step: int) -> float:
        """The base learning rate (before the schedule's factor) of step `step`."""
        return self.priming_lr if step < self.priming_steps else self.lr

    def to_dict(self) -> dict:
        """What a checkpoint records of the plan (`RECORDED`), as plain values."""
        return {name: asdict(self.far) if name == "far" and self.far else getattr(self, name) for name in RECORDED}

    def mismatches(self, saved: dict) -> list[str]:
        """The options that would make a run resumed from a checkpoint of `saved` diverge from it."""
        now = self.to_dict()
        return [
            f"{name}: saved {saved.get(name)!r}, now {now[name]!r}"
            for name in RECORDED
            if name not in _FREE_ON_RESUME and saved.get(name, _BEFORE_THE_OPTION.get(name)) != now[name]
        ]


# What a checkpoint records of its plan (far.training.checkpoint): a resumed run compares them.
RECORDED = (*(f.name for f in fields(TrainingPlan) if f.name != "options"), "freeze_embeddings", *ASKED)


def plan_training(n_examples: int, options: TrainOptions) -> TrainingPlan:
    """Resolve the step counts of `options` over `n_examples`; raises ValueError naming what does not fit."""
    total_steps = (
        options.max_steps
        if options.max_steps is not None
        else max(1, math.ceil(options.epochs * math.ceil(n_examples / options.batch_size) / options.grad_accum))
    )
    priming_steps = length_in_steps("priming", options.priming, total_steps) if options.primes else 0
    gradient_priming_steps = 0
    if options.scores_gradients:
        gradient_priming_steps, priming_steps = priming_steps, 0
    if options.primes and priming_steps + gradient_priming_steps == 0:
        raise ValueError(
            f"selection={options.config.selection!r} ranks FFN nodes by how much they move during priming, so "
            "priming must be > 0 (e.g. priming=0.1, a tenth of the steps); or use selection='random'"
        )
    lr = DEFAULT_LR[options.optimizer] if options.lr is None else options.lr
    priming_optimizer, priming_lr = options.active_priming_optimizer, None
    if priming_optimizer is not None:
        default = lr if priming_optimizer == options.optimizer else DEFAULT_LR[priming_optimizer]
        priming_lr = default if options.priming_lr is None else options.priming_lr
    warmup_steps = length_in_steps("warmup", options.warmup, total_steps)
    return TrainingPlan(
        options,
        n_examples,
        total_steps,
        priming_steps,
        warmup_steps,
        lr,
        priming_lr,
        priming_optimizer,
        far=options.config,
        bf16=options.bf16,
        frozen_from_start=options.frozen_from_start,
        gradient_priming_steps=gradient_priming_steps,
        layout_digest=None if options.layout is None else options.layout.digest,
    )
