"""`TrainingPlan`: every `far.finetune` option checked, and the step counts worked out, before training."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from far.config import AUTO, UNSET, FARConfig, as_config

DEFAULT_LR = {"adamw": 5e-5, "sgd": 1e-3, "mezo": 1e-6}
OPTIMIZERS = tuple(DEFAULT_LR)

# Options that do not change the trajectory: a resumed run may change them.
_FREE_ON_RESUME = {"eval_every", "checkpoint_every", "keep_checkpoints", "log_every", "cache_frozen_mib"}
# What a checkpoint written before an option existed ran with.
_BEFORE_THE_OPTION = {
    "reset_frozen": False,
    "freeze_layers": None,
    "frozen_from_start": False,
    "cache_frozen": False,
}


# The config's fields that far.finetune once took as keywords of its own.
_DEPRECATED_FIELDS = ("retention", "selection", "attention_retention")


def resolve_config(
    config: FARConfig | float | None, deprecated: dict[str, Any], *, seed: int, freeze_embeddings: bool
) -> FARConfig | None:
    """The one `FARConfig` of a run (or None), built here once from what the caller gave."""
    unknown = sorted(set(deprecated) - set(_DEPRECATED_FIELDS))
    if unknown:
        raise TypeError(f"far.finetune() got unexpected keyword argument(s) {unknown}")
    if deprecated:
        warnings.warn(
            f"far.finetune({', '.join(f'{k}=' for k in deprecated)}...) is deprecated; pass config=far.FARConfig(...) "
            "(or config=None for no surgery)",
            DeprecationWarning,
            stacklevel=3,
        )
        if config is not UNSET:
            raise TypeError(f"give the surgery once: config= or {sorted(deprecated)}, not both")
        if deprecated.get("retention", 0.4) is None:
            if deprecated.get("attention_retention") is not None:
                raise ValueError(
                    "attention_retention splits heads as part of FAR; give a retention too (e.g. retention=0.4)"
                )
            return None
        config = as_config(seed=seed, freeze_embeddings=freeze_embeddings, **deprecated)
    elif config is UNSET or (config is not None and not isinstance(config, FARConfig)):
        # a number is the retention; FARConfig refuses anything else with a clear message
        config = as_config(config, seed=seed, freeze_embeddings=freeze_embeddings)
    elif config is not None and freeze_embeddings and not config.freeze_embeddings:
        raise ValueError(
            "freeze_embeddings=True beside a FARConfig: set FARConfig(freeze_embeddings=True) instead, so that the "
            "config says the whole surgery"
        )
    return config


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int(name: str, value: object, minimum: int, hint: str = "") -> int:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}{'; ' + hint if hint else ''}")
    return int(value)


def _float(name: str, value: object, *, low: float, hint: str, strict: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or (value <= low if strict else value < low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low}, got {value!r}; {hint}")
    return float(value)


def _optimizer_name(name: str, value: object) -> str:
    if value not in OPTIMIZERS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, OPTIMIZERS))}, got {value!r}")
    return value


def check_length(name: str, value: object) -> float | int:
    """Check a length given as a fraction of a run's steps in [0, 1) or as a number of steps (an int).

    The one reader of such lengths (priming, warmup): `far.finetune`, `far.FARCallback` and the
    command line all come through it.
    """
    if _is_int(value) and value >= 0:
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 <= value < 1.0:
        return float(value)
    raise ValueError(f"{name} must be a fraction of the steps in [0, 1) or a number of steps (an int), got {value!r}")


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


def frozen_from_start(
    config: FARConfig | None, priming_steps: int, reset_frozen: bool, prime_frozen: bool | None
) -> bool:
    """Whether priming leaves alone what the surgery will freeze anyway: the embeddings and a fixed depth.

    With `reset_frozen` (the default), the surgery puts those tensors back to their pre-priming
    values, so training them during priming is work thrown away, and the rest of the model would
    have adapted to values it then loses. Frozen from the first step, priming costs what training
    after the surgery costs there (no embedding gradient, backward stops at layer K). `prime_frozen`
    True trains them during priming all the same (the FAR paper primes the whole model); None decides
    by `reset_frozen`. A depth chosen from the scores (`"auto"`) is known only after priming.
    """
    if config is None or not priming_steps:
        return False
    up_front = config.freeze_embeddings or (config.freeze_layers is not None and config.freeze_layers != AUTO)
    prime = (not reset_frozen) if prime_frozen is None else prime_frozen
    return up_front and not prime


def plan_training(
    n_examples: int,
    *,
    optimizer: str,
    config: FARConfig | None,
    priming: float | int,
    priming_optimizer: str,
    priming_lr: float | None,
    freeze_embeddings: bool,
    freeze_ffn: bool,
    freeze_layers: int | None = None,
    reset_frozen: bool = True,
    prime_frozen: bool | None = None,
    epochs: float,
    max_steps: int | None,
    lr: float | None,
    batch_size: int,
    warmup: float | int,
    weight_decay: float,
    grad_accum: int,
    max_grad_norm: float | None,
    bf16: bool,
    seed: int,
    mezo_eps: float,
    mezo_directions: int,
    eval_every: int | None,
    checkpoint_every: int | None,
    keep_checkpoints: int | None,
    log_every: int,
    cache_frozen: bool = False,
    cache_frozen_mib: float = 1024.0,
) -> TrainingPlan:
    """Check every option and resolve the step counts; raises ValueError/TypeError naming the bad one."""
    optimizer = _optimizer_name("optimizer", optimizer)
    priming_optimizer = _optimizer_name("priming_optimizer", priming_optimizer)
    if config is not None and not isinstance(config, FARConfig):
        raise TypeError(f"config must be a far.FARConfig or None, got {type(config).__name__}")
    far = config
    if far is not None:
        if freeze_ffn:
            raise ValueError("freeze_ffn=True is the freeze-FFN ablation of full fine-tuning; use it with config=None")
        if freeze_embeddings:
            raise ValueError(
                "with a FARConfig, the surgery freezes the embeddings: set FARConfig(freeze_embeddings=True) "
                "instead of freeze_embeddings=True"
            )
        if freeze_layers is not None:
            raise ValueError(
                "with a FARConfig, the surgery freezes the layers: set FARConfig(freeze_layers=...) instead of "
                "freeze_layers=..."
            )
        freeze_embeddings = far.freeze_embeddings
    elif freeze_layers is not None and (not _is_int(freeze_layers) or freeze_layers < 0):
        raise ValueError(
            f"freeze_layers without FAR's surgery must be a number of bottom layers >= 0, got {freeze_layers!r} "
            "('auto' reads FAR's priming scores: use it in a FARConfig)"
        )
    flags = (("freeze_embeddings", freeze_embeddings), ("freeze_ffn", freeze_ffn), ("reset_frozen", reset_frozen))
    for name, flag in (*flags, ("bf16", bf16), ("cache_frozen", cache_frozen)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if prime_frozen is not None and not isinstance(prime_frozen, bool):
        raise TypeError(f"prime_frozen must be True, False or None (decided by reset_frozen), got {prime_frozen!r}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {seed!r}")
    depth = far.freeze_layers if far is not None else freeze_layers
    if cache_frozen and (depth is None or depth == 0):
        raise ValueError(
            "cache_frozen keeps the output of the frozen bottom layers, and this run freezes none: freeze some "
            "(FARConfig(freeze_layers=K or 'auto'), or freeze_layers=K without a config, K >= 1)"
        )
    cache_frozen_mib = _float("cache_frozen_mib", cache_frozen_mib, low=0.0, hint="the MiB the kept states may take")
    batch_size = _int("batch_size", batch_size, 1)
    grad_accum = _int("grad_accum", grad_accum, 1, "the number of batches per optimizer step")
    if max_steps is not None:
        total_steps = _int("max_steps", max_steps, 1, "or leave it None to train for `epochs`")
    else:
        epochs = _float("epochs", epochs, low=0.0, strict=True, hint="e.g. epochs=3 (or set max_steps)")
        total_steps = max(1, math.ceil(epochs * math.ceil(n_examples / batch_size) / grad_accum))
    # Random selection needs no scores, unless freeze_layers="auto" reads them to choose the depth.
    primes = far is not None and (far.selection != "random" or far.freeze_layers == AUTO)
    priming_steps = length_in_steps("priming", priming, total_steps) if primes else 0
    if primes and priming_steps == 0:
        raise ValueError(
            f"selection={far.selection!r} ranks FFN nodes by how much they move during priming, so priming must be "
            "> 0 (e.g. priming=0.1, a tenth of the steps); or use selection='random'"
        )
    hint = "it must be > 0, e.g. 5e-5 for AdamW or 1e-6 for MeZO (None picks the optimizer's default)"
    lr = DEFAULT_LR[optimizer] if lr is None else _float("lr", lr, low=0.0, strict=True, hint=hint)
    if priming_steps:
        default = lr if priming_optimizer == optimizer else DEFAULT_LR[priming_optimizer]
        priming_lr = (
            default if priming_lr is None else _float("priming_lr", priming_lr, low=0.0, strict=True, hint=hint)
        )
    else:
        priming_optimizer = priming_lr = None
    if max_grad_norm is not None:
        max_grad_norm = (
            _float("max_grad_norm", max_grad_norm, low=0.0, hint="or None (0 also turns clipping off)") or None
        )
    return TrainingPlan(
        optimizer=optimizer,
        far=far,
        priming_optimizer=priming_optimizer,
        freeze_embeddings=freeze_embeddings,
        freeze_ffn=freeze_ffn,
        freeze_layers=freeze_layers,
        reset_frozen=reset_frozen,
        n_examples=n_examples,
        batch_size=batch_size,
        grad_accum=grad_accum,
        total_steps=total_steps,
        priming_steps=priming_steps,
        warmup_steps=length_in_steps("warmup", warmup, total_steps),
        lr=lr,
        priming_lr=priming_lr,
        weight_decay=_float("weight_decay", weight_decay, low=0.0, hint="e.g. 0.0 or 0.01"),
        max_grad_norm=max_grad_norm,
        bf16=bf16,
        seed=int(seed),
        mezo_eps=_float("mezo_eps", mezo_eps, low=0.0, strict=True, hint="the MeZO perturbation scale, e.g. 1e-3"),
        mezo_directions=_int("mezo_directions", mezo_directions, 1),
        eval_every=None if eval_every is None else _int("eval_every", eval_every, 1, "or None"),
        checkpoint_every=None if checkpoint_every is None else _int("checkpoint_every", checkpoint_every, 1, "or None"),
        keep_checkpoints=None
        if keep_checkpoints is None
        else _int("keep_checkpoints", keep_checkpoints, 1, "or None to keep all"),
        log_every=_int("log_every", log_every, 1),
        frozen_from_start=frozen_from_start(far, priming_steps, reset_frozen, prime_frozen),
        cache_frozen=cache_frozen,
        cache_frozen_mib=cache_frozen_mib,
    )
