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
}


def steps_of(value: float | int, total: int, name: str = "length") -> int:
    """The steps that a length (see `check_length`) makes of `total` steps; a fraction rounds up.

    Example:
        >>> steps_of(0.1, 95), steps_of(5, 95), steps_of(0.001, 10)
        (10, 5, 1)
    """
    value = check_length(name, value)
    return value if isinstance(value, int) else math.ceil(value * total)


def length_in_steps(name: str, value: float | int, total: int, what: str | None = None) -> int:
    """`steps_of` a run of `total` steps, refused unless shorter than the run."""
    steps, what = steps_of(value, total, name), what or name
    if steps and steps >= total:
        raise ValueError(
            f"{name}={value!r} means {steps} steps of {what}, but the run has only {total} steps in all; "
            f"{what} must be shorter than the run: lower {name} or raise epochs / max_steps"
        )
    return steps


@dataclass(frozen=True)
class TrainingPlan:
    """The validated options of one `far.finetune` run, with its step counts resolved.

    Steps count optimizer steps (each over `grad_accum` batches) from the start of priming; the
    priming steps are the first `priming_steps` of `total_steps`.
    """

    optimizer: str
    far: FARConfig | None  # None: no surgery (full fine-tuning, or the freeze-FFN ablation)
    priming_optimizer: str | None  # None: no priming phase
    freeze_embeddings: bool
    freeze_ffn: bool
    freeze_layers: int | None  # without surgery: the bottom layers frozen whole (with it: far.freeze_layers)
    reset_frozen: bool  # frozen tensors back to their pre-priming values at the switch
    n_examples: int
    batch_size: int
    grad_accum: int
    total_steps: int
    priming_steps: int
    warmup_steps: int
    lr: float
    priming_lr: float | None
    weight_decay: float
    max_grad_norm: float | None
    bf16: bool
    seed: int
    mezo_eps: float
    mezo_directions: int
    eval_every: int | None
    checkpoint_every: int | None
    keep_checkpoints: int | None
    log_every: int
    # What the FARConfig freezes up front (its embeddings, a fixed freeze_layers) is frozen from the first
    # priming step instead of at the surgery: see `frozen_from_start`.
    frozen_from_start: bool = False
    # The frozen bottom runs without dropout and its output is kept per example (far.training.frozen_bottom).
    cache_frozen: bool = False
    cache_frozen_mib: float = 1024.0
    # Batches of similar lengths (far.training.batches.BatchStream): the same examples an epoch, less padding.
    group_by_length: bool = False
    # Gradient priming (TrainOptions.priming_scores="gradient"): the batches of this many first steps are
    # scored before step 0, without an update; priming_steps is then 0 and every step trains the split model.
    gradient_priming_steps: int = 0

    def optimizer_at(self, step: int) -> str:
        """The optimizer that takes step `step` (0-based)."""
        return self.priming_optimizer if step < self.priming_steps else self.optimizer

    def lr_at(self, step: int) -> float:
        """The base learning rate (before the schedule's factor) of step `step`."""
        return self.priming_lr if step < self.priming_steps else self.lr

    def to_dict(self) -> dict:
        return asdict(self)

    def mismatches(self, saved: dict) -> list[str]:
        """The options that would make a run resumed from a checkpoint of `saved` diverge from it."""
        now = self.to_dict()
        return [
            f"{f.name}: saved {saved.get(f.name)!r}, now {now[f.name]!r}"
            for f in fields(self)
            if f.name not in _FREE_ON_RESUME and saved.get(f.name, _BEFORE_THE_OPTION.get(f.name)) != now[f.name]
        ]


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
    return TrainingPlan(
        optimizer=options.optimizer,
        far=options.config,
        priming_optimizer=priming_optimizer,
        freeze_embeddings=options.embeddings_frozen,
        freeze_ffn=options.freeze_ffn,
        freeze_layers=options.freeze_layers,
        reset_frozen=options.reset_frozen,
        n_examples=n_examples,
        batch_size=options.batch_size,
        grad_accum=options.grad_accum,
        total_steps=total_steps,
        priming_steps=priming_steps,
        warmup_steps=length_in_steps("warmup", options.warmup, total_steps),
        lr=lr,
        priming_lr=priming_lr,
        weight_decay=options.weight_decay,
        max_grad_norm=options.max_grad_norm,
        bf16=options.bf16,
        seed=options.seed,
        mezo_eps=options.mezo_eps,
        mezo_directions=options.mezo_directions,
        eval_every=options.eval_every,
        checkpoint_every=options.checkpoint_every,
        keep_checkpoints=options.keep_checkpoints,
        log_every=options.log_every,
        frozen_from_start=options.frozen_from_start,
        cache_frozen=options.cache_frozen,
        cache_frozen_mib=options.cache_frozen_mib,
        gradient_priming_steps=gradient_priming_steps,
        group_by_length=options.group_by_length,
    )
