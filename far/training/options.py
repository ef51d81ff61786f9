"""`TrainOptions`: how `far.finetune` trains, built and checked once, and the rules read from it.

Everything a run is asked for but the model, data, callables and paths, as one frozen dataclass that checks its
fields when built (the `FARConfig` pattern); `far.finetune` builds it from its keywords, a recipe from its settings
(`RunSettings.train_options`), and the rules several callers need are read from it (`primes`, `frozen_from_start`).

    >>> options = TrainOptions(FARConfig(0.2, freeze_embeddings=True), optimizer="mezo", max_steps=100)
    >>> options.primes, options.frozen_from_start
    (True, True)
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from far.config import AUTO, UNSET, FARConfig, as_config
from far.saving.layout_file import SharedLayout
from far.selection import needs_scores
from far.training.precision import Precision, check_precision, choose_precision

# Default learning rates, the one table: per kind of run, per optimizer. "finetune" is far.finetune's, for a model of
# any size (BERT-base's usual AdamW rate; MeZO's paper's). The others are the `far` commands' (the hyper-parameter
# tables of far.recipes, the device export's): MiniLM-size encoders take a higher AdamW rate than BERT-base's
# 2e-5..5e-5, MeZO many cheap steps at a small rate. On SmolLM2-135M's SST-2 prompts (experiments/llm_sst2.py),
# MeZO + FAR trained well at 3e-4 in 80 steps where MeZO on every weight diverged: 1e-4 is the safe rate for both.
# On texts, the rates that experiments/own_texts_optimizers.py picked on chunks held out of the training split.
LEARNING_RATES = {
    "finetune": {"adamw": 5e-5, "sgd": 1e-3, "mezo": 1e-6},
    "encoder": {"adamw": 1e-4, "sgd": 0.01, "mezo": 1e-5},  # far glue, far train on labelled files, the device
    "encoder QA": {"adamw": 5e-5, "mezo": 1e-5},  # far squad
    "causal LM prompts": {"adamw": 1e-5, "mezo": 1e-4},
    "causal LM texts": {"adamw": 3e-4, "mezo": 1e-4, "zo-batched": 1e-5},
}
DEFAULT_LR = LEARNING_RATES["finetune"]
OPTIMIZERS = tuple(DEFAULT_LR)
# What priming scores a node by: "change", how far the first `priming` steps moved it; "gradient", its weights'
# gradient L1 over those steps' batches before any update (far.training.gradient_priming; nothing trains on them).
PRIMING_SCORES = ("change", "gradient")

_BOOLEANS = "freeze_embeddings freeze_ffn reset_frozen bf16 cache_frozen group_by_length progress stop_after_priming"
# The config's fields that far.finetune once took as keywords of its own.
_DEPRECATED_FIELDS = ("retention", "selection", "attention_retention")


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int, hint: str = "") -> int:
    """`value` as an int, refused unless an int >= `minimum`."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}{'; ' + hint if hint else ''}")
    return int(value)


def check_float(
    name: str, value: object, *, low: float, hint: str = "", strict: bool = False, high: float | None = None
) -> float:
    """`value` as a float, refused unless finite, >= `low` (> with `strict`) and < `high` (if given)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or (value <= low if strict else value < low) or (high is not None and value >= high):
        bound = f"{'>' if strict else '>='} {low}{'' if high is None else f' and < {high}'}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}{'; ' + hint if hint else ''}")
    return float(value)


def check_optimizer(name: str, value: object) -> str:
    if value not in OPTIMIZERS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, OPTIMIZERS))}, got {value!r}")
    return value


def check_length(name: str, value: object) -> float | int:
    """Check a length given as a fraction of a run's steps in [0, 1) or as a number of steps (an int).

    The one reader of such lengths (priming, warmup): `far.finetune`, `far.FARCallback` and the
    command line all come through it.
    """
    if is_int(value) and value >= 0:
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 <= value < 1.0:
        return float(value)
    raise ValueError(f"{name} must be a fraction of the steps in [0, 1) or a number of steps (an int), got {value!r}")


def check_plain_depth(freeze_layers: object) -> int | None:
    """A depth frozen without FAR's surgery: a number of bottom layers (or None); "auto" needs priming's scores."""
    if freeze_layers is not None and (not is_int(freeze_layers) or freeze_layers < 0):
        raise ValueError(
            f"freeze_layers={freeze_layers!r} (--freeze-layers) without FAR's surgery must be a number of bottom "
            "layers >= 0, e.g. 2; 'auto' picks the depth from FAR's priming scores, which only FAR's surgery has "
            "(a FARConfig; on the command line --method far)"
        )
    return freeze_layers


def resolve_config(
    config: FARConfig | float | None, deprecated: dict[str, Any], *, seed: int, freeze_embeddings: bool
) -> FARConfig | None:
    """The one `FARConfig` of a `far.finetune` call (or None), built here once from what the caller gave."""
    unknown = sorted(set(deprecated) - set(_DEPRECATED_FIELDS))
    if unknown:
        raise TypeError(f"far.finetune() got unexpected keyword argument(s) {unknown}")
    if deprecated:
        warnings.warn(
            f"far.finetune({', '.join(f'{k}=' for k in deprecated)}...) is deprecated; pass config=far.FARConfig(...) "
            "(or config=None for no surgery)",
            DeprecationWarning,
            stacklevel=4,
        )
        if config is not UNSET:
            raise TypeError(f"give the surgery once: config= or {sorted(deprecated)}, not both")
        if deprecated.get("retention", 0.4) is None:
            if deprecated.get("attention_retention") is not None:
                raise ValueError(
                    "attention_retention splits heads as part of FAR; give a retention too (e.g. retention=0.4)"
                )
            return None
        return as_config(seed=seed, freeze_embeddings=freeze_embeddings, **deprecated)
    if config is UNSET or (config is not None and not isinstance(config, FARConfig)):
        # a number is the retention; FARConfig refuses anything else with a clear message
        return as_config(config, seed=seed, freeze_embeddings=freeze_embeddings)
    if config is not None and freeze_embeddings and not config.freeze_embeddings:
        raise ValueError(
            "freeze_embeddings=True beside a FARConfig: set FARConfig(freeze_embeddings=True) instead, so that the "
            "config says the whole surgery"
        )
    return config


@dataclass(frozen=True)
class TrainOptions:
    """How a `far.finetune` run trains; every field is checked when the options are built.

    The fields are `far.finetune`'s keywords of the same names (see its docstring), with `config`
    resolved: a `FARConfig`, or None for no surgery. With a config, the config alone says what the
    surgery freezes: `freeze_embeddings` and `freeze_layers` here are plain freezing without one.
    """

    config: FARConfig | None = None
    optimizer: str = "adamw"
    priming: float | int = 0.1
    priming_optimizer: str = "adamw"
    priming_lr: float | None = None
    priming_scores: str = "change"
    freeze_embeddings: bool = False
    freeze_ffn: bool = False
    freeze_layers: int | None = None
    reset_frozen: bool = True
    prime_frozen: bool | None = None
    epochs: float = 1.0
    max_steps: int | None = None
    lr: float | None = None
    batch_size: int = 32
    warmup: float | int = 0.0
    weight_decay: float = 0.0
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    bf16: bool = False
    precision: str | None = None
    seed: int = 0
    mezo_eps: float = 1e-3
    mezo_directions: int = 1
    eval_every: int | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = 2
    log_every: int = 1
    progress: bool = True
    cache_frozen: bool = False
    cache_frozen_mib: float = 1024.0
    group_by_length: bool = False
    memory_budget: float | None = None
    max_length: int = 128
    eval_batch_size: int = 64
    # A layout primed once and shared (far.saving.shared_layout): its learners at step 0, no priming step.
    layout: SharedLayout | None = None
    # Run the priming phase only, and end with the surgery it chooses (far.training.prime_layout).
    stop_after_priming: bool = False

    def __post_init__(self) -> None:
        self._check_surgery()
        self._check_layout()
        for name in _BOOLEANS.split():
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.prime_frozen is not None and not isinstance(self.prime_frozen, bool):
            raise TypeError(
                f"prime_frozen must be True, False or None (decided by reset_frozen), got {self.prime_frozen!r}"
            )
        if not is_int(self.seed):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        if self.precision is not None:
            check_precision(self.precision)
            if self.bf16 and self.precision != "bf16":
                raise ValueError(f"bf16=True asks for bf16 and precision={self.precision!r} for another: give one")
        if self.cache_frozen and self.depth in (None, 0):
            raise ValueError(
                "cache_frozen (--cache-frozen) keeps the output of the frozen bottom layers, and this run freezes "
                "none: freeze some (FARConfig(freeze_layers=K or 'auto'), or freeze_layers=K without a config; on the "
                "command line --freeze-layers K or --freeze-layers auto, K >= 1)"
            )
        if self.cache_frozen and self.memory_budget is not None:
            raise ValueError(
                "cache_frozen (--cache-frozen) keeps states that the memory budget (--memory-budget) does not plan "
                "for: use one of the two"
            )
        hint = "it must be > 0, e.g. 5e-5 for AdamW or 1e-6 for MeZO (None picks the optimizer's default)"
        set_ = self._set
        set_("optimizer", check_optimizer("optimizer", self.optimizer))
        set_("priming_optimizer", check_optimizer("priming_optimizer", self.priming_optimizer))
        set_("priming", check_length("priming", self.priming))
        if self.priming_scores not in PRIMING_SCORES:
            raise ValueError(
                f"priming_scores must be one of {', '.join(map(repr, PRIMING_SCORES))}, got {self.priming_scores!r}"
            )
        auto_retention = self.config is not None and self.config.retention == AUTO
        if self.memory_budget is not None and (auto_retention or self.scores_gradients):
            raise ValueError(
                "the memory budget (--memory-budget) plans for a fixed retention and weight-change priming: give "
                "retention a number and priming_scores='change' (--priming-scores change), or no memory budget"
            )
        set_("warmup", check_length("warmup", self.warmup))
        set_("seed", int(self.seed))
        set_("batch_size", check_int("batch_size", self.batch_size, 1))
        set_("grad_accum", check_int("grad_accum", self.grad_accum, 1, "the number of batches per optimizer step"))
        if self.max_steps is not None:
            set_("max_steps", check_int("max_steps", self.max_steps, 1, "or leave it None to train for `epochs`"))
        else:
            set_("epochs", check_float("epochs", self.epochs, low=0.0, strict=True, hint="e.g. 3 (or set max_steps)"))
        for name in ("lr", "priming_lr"):
            if getattr(self, name) is not None:
                set_(name, check_float(name, getattr(self, name), low=0.0, strict=True, hint=hint))
        if self.max_grad_norm is not None:
            norm = check_float("max_grad_norm", self.max_grad_norm, low=0.0, hint="or None (0 also turns clipping off)")
            set_("max_grad_norm", norm or None)
        set_("weight_decay", check_float("weight_decay", self.weight_decay, low=0.0, hint="e.g. 0.0 or 0.01"))
        set_("mezo_eps", check_float("mezo_eps", self.mezo_eps, low=0.0, strict=True, hint="MeZO's scale, e.g. 1e-3"))
        set_("mezo_directions", check_int("mezo_directions", self.mezo_directions, 1))
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) is not None:
                set_(name, check_int(name, getattr(self, name), 1, "or None"))
        if self.keep_checkpoints is not None:
            set_("keep_checkpoints", check_int("keep_checkpoints", self.keep_checkpoints, 1, "or None to keep all"))
        set_("log_every", check_int("log_every", self.log_every, 1))
        set_("cache_frozen_mib", check_float("cache_frozen_mib", self.cache_frozen_mib, low=0.0, hint="the MiB"))
        budget = self.memory_budget
        positive = isinstance(budget, numbers.Real) and not isinstance(budget, bool) and budget > 0
        if budget is not None and not positive:
            raise ValueError(f"the memory budget must be a positive number of MiB, got {budget!r}")
        set_("max_length", check_int("max_length", self.max_length, 1))
        set_("eval_batch_size", check_int("eval_batch_size", self.eval_batch_size, 1))

    def _check_layout(self) -> None:
        layout = self.layout
        if layout is None and self.stop_after_priming and not self.primes:
            raise ValueError("stop_after_priming runs FAR's priming alone: give a config that primes, e.g. 'auto'")
        if layout is not None and not isinstance(layout, SharedLayout):
            raise TypeError(f"layout must be a path or a far.saving.shared_layout.SharedLayout, got {layout!r}")
        if layout is not None and self.config != layout.config:
            raise ValueError(
                f"a layout sets the surgery ({layout.config}), and the config given differs ({self.config}): leave "
                "config out (on the command line: --retention, --preset, --freeze-layers, --freeze-embeddings)"
            )
        if layout is not None and (self.memory_budget is not None or self.stop_after_priming):
            raise ValueError("a layout skips priming: it takes no memory budget (--memory-budget), nor a priming")

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _check_surgery(self) -> None:
        config = self.config
        if config is not None and not isinstance(config, FARConfig):
            raise TypeError(f"config must be a far.FARConfig or None, got {type(config).__name__}")
        if config is not None:
            if self.freeze_ffn:
                raise ValueError(
                    "freeze_ffn=True is the freeze-FFN ablation of full fine-tuning; use it with config=None"
                )
            if self.freeze_embeddings:
                raise ValueError(
                    "with a FARConfig, the surgery freezes the embeddings: set FARConfig(freeze_embeddings=True) "
                    "instead of freeze_embeddings=True"
                )
            if self.freeze_layers is not None:
                raise ValueError(
                    "with a FARConfig, the surgery freezes the layers: set FARConfig(freeze_layers=...) instead of "
                    "freeze_layers=..."
                )
        else:
            check_plain_depth(self.freeze_layers)

    @classmethod
    def from_call(
        cls,
        options: TrainOptions | None,
        config: FARConfig | float | None,
        keywords: dict[str, Any],
        deprecated: dict[str, Any],
    ) -> TrainOptions:
        """The options of a `far.finetune` call: `options` as given, or built from the call's keywords.

        A call gives its options once: with `options`, every keyword is left at its default.
        """
        if options is None:
            resolved = resolve_config(
                config, deprecated, seed=keywords["seed"], freeze_embeddings=keywords["freeze_embeddings"]
            )
            if resolved is not None:
                keywords = {**keywords, "freeze_embeddings": False}  # the config says it
            return cls(resolved, **keywords)
        if not isinstance(options, TrainOptions):
            raise TypeError(f"options must be a far.training.TrainOptions, got {type(options).__name__}")
        defaults = {f.name: f.default for f in fields(cls)}
        given = sorted(name for name, value in keywords.items() if value != defaults[name])
        given += sorted(deprecated) + (["config"] if config is not UNSET else [])
        if given:
            raise TypeError(f"give the training options once: options= or keywords, not both (also given: {given})")
        return options

    @property
    def depth(self) -> int | str | None:
        """The bottom layers frozen whole: the config's `freeze_layers` (K or "auto"), or the plain one."""
        return self.config.freeze_layers if self.config is not None else self.freeze_layers

    @property
    def requested_precision(self) -> str:
        """The precision asked for: `precision` ("auto", "fp32" or "bf16"); when None, `bf16` says (True: "bf16")."""
        if self.precision is not None:
            return self.precision
        return "bf16" if self.bf16 else "fp32"

    def precision_for(self, model: nn.Module) -> Precision:
        """What the run computes in on `model`'s device: the one rule that training and evaluation both read, so that
        a model trained under bf16 autocast is also scored under it (and one trained in fp32, in fp32)."""
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        return choose_precision(self.requested_precision, device)

    @property
    def embeddings_frozen(self) -> bool:
        """Whether the run freezes the embeddings (by the config's surgery, or plainly)."""
        return self.config.freeze_embeddings if self.config is not None else self.freeze_embeddings

    @property
    def primes(self) -> bool:
        """Whether the run has a priming phase: FAR ranks nodes by priming's change, and random selection
        needs none unless `freeze_layers="auto"` reads the scores to choose the depth."""
        return self.config is not None and needs_scores(self.config) and self.layout is None

    @property
    def frozen_from_start(self) -> bool:
        """Whether priming leaves alone what the surgery will freeze anyway: the embeddings and a fixed depth.

        With `reset_frozen` (the default), the surgery puts those tensors back to their pre-priming
        values, so training them during priming is work thrown away, and the rest of the model would
        have adapted to values it then loses. Frozen from the first step, priming costs what training
        after the surgery costs there (no embedding gradient, backward stops at layer K). `prime_frozen`
        True trains them during priming all the same (the FAR paper primes the whole model); None decides
        by `reset_frozen`. A depth chosen from the scores (`"auto"`) is known only after priming.
        """
        config = self.config
        if config is None or not self.primes or self.scores_gradients:  # gradient priming trains nothing
            return False
        up_front = config.freeze_embeddings or (config.freeze_layers is not None and config.freeze_layers != AUTO)
        prime = (not self.reset_frozen) if self.prime_frozen is None else self.prime_frozen
        return up_front and not prime

    @property
    def scores_gradients(self) -> bool:
        """Whether the run primes by gradients (`priming_scores="gradient"`): scored batches, no priming steps."""
        return self.primes and self.priming_scores == "gradient"

    @property
    def active_priming_optimizer(self) -> str | None:
        """The optimizer of the priming steps; None without priming steps (none, or gradient priming)."""
        return self.priming_optimizer if self.primes and not self.scores_gradients else None


OPTION_NAMES = tuple(f.name for f in fields(TrainOptions) if f.name != "config")
