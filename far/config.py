"""The frozen configuration of one FAR reconfiguration."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

SELECTIONS = ("per_layer", "global", "random")
AUTO = "auto"  # chosen from the priming scores: far.selection.auto_freeze_layers, far.selection.auto_retention
PAPER_RETENTION = 0.4  # the FAR paper's fixed share of learner nodes
# The named configurations (`FARConfig.preset`): "auto", what `far glue/train/squad --method far` run by default,
# and "paper", the FAR paper's fixed retention with nothing else frozen.
PRESETS = ("auto", "paper")


def check_retention(retention: object, name: str = "retention", what: str = "FFN nodes") -> float:
    """Return `retention` as a float, or raise if it is not a number in (0, 1]."""
    if isinstance(retention, bool) or not isinstance(retention, numbers.Real):
        raise TypeError(
            f"{name} must be a number in (0, 1], got {retention!r} of type "
            f"{type(retention).__name__}; e.g. {name}=0.4 keeps 40% of each layer's {what} trainable"
        )
    value = float(retention)
    if math.isnan(value) or not 0.0 < value <= 1.0:
        raise ValueError(
            f"{name} must be in (0, 1], got {retention!r}; it is the fraction of {what} that "
            "stay trainable (1.0 keeps them all)"
        )
    return value


def check_freeze_layers(value: object) -> int | str | None:
    """`value` as None, an int >= 0 or "auto", or raise (the layer count is checked against the model)."""
    if value is None or (isinstance(value, str) and value == AUTO):
        return value
    if isinstance(value, str):
        raise ValueError(
            f"freeze_layers must be None, an int >= 0 or {AUTO!r}, got the string {value!r}; "
            f"e.g. freeze_layers=2 freezes the bottom two layers, freeze_layers={AUTO!r} picks them from the "
            "priming scores"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"freeze_layers must be None, an int >= 0 or {AUTO!r}, got {value!r} of type {type(value).__name__}; "
            "it counts the bottom layers frozen whole"
        )
    if value < 0:
        raise ValueError(f"freeze_layers must be >= 0 (the number of bottom layers frozen whole), got {value}")
    return int(value)


@dataclass(frozen=True)
class FARConfig:
    """How a model is reconfigured.

    Args:
        retention: Fraction of each FFN's nodes that stay trainable (the *learners*), in (0, 1], or
            `"auto"`: each FFN's own fraction chosen from the priming scores (the fewest top nodes that
            hold a set share of the FFN's total score, see `far.selection.auto_retention`); it needs
            scores, so not `selection="random"`.
        selection: `"per_layer"` (top nodes of each FFN by priming score), `"global"` (top nodes
            across all FFNs, at least one per FFN) or `"random"` (seeded; the paper's baseline).
        seed: Seed of the random selection; unused by the other strategies.
        freeze_embeddings: Also freeze every `nn.Embedding` of the model (word, position and
            token-type embeddings; a tied LM head is frozen with them).
        recompute_activations: Keep less for backward (the default): an output projection rebuilds
            the learners' activation from what the activation function keeps anyway (GELU and SiLU
            their input, a gated MLP its two factors) instead of keeping a copy of it. It costs one
            elementwise op over the learners' part of the activation per layer in backward, too little
            to measure beside a step, and keeps less for backward (docs/results.md, "Recomputing
            activations, and bf16 autocast"). False keeps a copy.
        attention_retention: Also split every attention block: this fraction of each layer's
            heads (key/value groups under grouped-query attention) stays trainable, chosen by the
            same `selection` from the heads' priming scores. None (default) leaves attention as it is.
        freeze_layers: Freeze the bottom layers whole, and everything below them (the embeddings),
            so that backward stops at the lowest trainable layer: an int K >= 0 (the bottom K
            layers; K must be below the model's layer count, which `far.reconfigure` checks), or
            `"auto"` (K chosen from the priming scores, see `far.selection.auto_freeze_layers`).
            The learner budget (retention x all FFN nodes) is then spent over the layers that stay
            trainable, by the same `selection`. None (default): every layer keeps learners.
    """

    retention: float | str = PAPER_RETENTION
    selection: str = "per_layer"
    seed: int = 0
    freeze_embeddings: bool = False
    recompute_activations: bool = True
    attention_retention: float | None = None
    freeze_layers: int | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retention, str):
            if self.retention != AUTO:  # a type error, as for any other non-number
                raise TypeError(
                    f"retention must be a number in (0, 1] or {AUTO!r}, got the string {self.retention!r}; e.g. "
                    f"retention=0.4 keeps 40% of each FFN's nodes trainable, retention={AUTO!r} picks each FFN's "
                    "share from the priming scores"
                )
            if self.selection == "random":
                raise ValueError(
                    f"retention={AUTO!r} is chosen from the priming scores, which selection='random' does not read; "
                    "give random selection a number (e.g. retention=0.2), or use selection='per_layer'"
                )
        else:
            object.__setattr__(self, "retention", check_retention(self.retention))
        if self.attention_retention is not None:
            value = check_retention(self.attention_retention, "attention_retention", "attention heads")
            object.__setattr__(self, "attention_retention", value)
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(map(repr, SELECTIONS))}, got {self.selection!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        for name in ("freeze_embeddings", "recompute_activations"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        object.__setattr__(self, "freeze_layers", check_freeze_layers(self.freeze_layers))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def freezes_depth(self) -> bool:
        """Whether bottom layers are frozen whole (a depth K >= 1, or "auto"): what a run can keep the output of
        (`cache_frozen`), as a named configuration does."""
        return self.freeze_layers == AUTO or bool(self.freeze_layers)

    @classmethod
    def auto(cls, **fields: Any) -> FARConfig:
        """FAR's automatic configuration: each FFN's retention and the frozen depth chosen from the priming
        scores, the embeddings frozen. What `far glue/train/squad --method far` run with no other flag (they also
        keep the frozen bottom's output per example: `far.finetune(model, data, config="auto")`). `fields`
        change single fields.

        Example:
            >>> FARConfig.auto() == FARConfig(retention="auto", freeze_embeddings=True, freeze_layers="auto")
            True
        """
        return cls(**{"retention": AUTO, "freeze_embeddings": True, "freeze_layers": AUTO, **fields})

    @classmethod
    def paper(cls, **fields: Any) -> FARConfig:
        """The FAR paper's configuration: a fixed retention of 0.4 in every FFN, nothing else frozen
        (`--preset paper`, or `--retention 0.4`, on the command line). `fields` change single fields.

        Example:
            >>> FARConfig.paper() == FARConfig(retention=0.4)
            True
        """
        return cls(**{"retention": PAPER_RETENTION, **fields})

    @classmethod
    def preset(cls, name: str, **fields: Any) -> FARConfig:
        """The named configuration `name` (one of `PRESETS`: "auto" or "paper"), `fields` changing single fields."""
        if name not in PRESETS:
            raise ValueError(f"the configurations are named {', '.join(map(repr, PRESETS))}, got {name!r}")
        return cls.auto(**fields) if name == "auto" else cls.paper(**fields)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


# Default of a verb's `config` argument: "not given" is not the same as an explicit None, which is
# a bad retention and must be refused rather than silently replaced by the default 0.4.
UNSET: Any = _Unset()


def as_config(config: FARConfig | float = UNSET, **fields: Any) -> FARConfig:
    """The `FARConfig` that a verb's arguments describe: a config, or its fields as keywords.

    Every verb that takes a configuration (`far.reconfigure`, `far.FARCallback`, ...) accepts
    either form, like torchao's `quantize_(model, config)`. This is the one place that turns the
    keywords into a config, so they are checked once, by `FARConfig` itself. A number in place of
    the config is the retention (`far.reconfigure(model, 0.4)`); fields left None take the
    config's defaults.

    Raises:
        TypeError: a config and keywords at once (which should win is not clear).

    Example:
        >>> as_config(retention=0.4, selection="random") == FARConfig(0.4, "random")
        True
    """
    known = [f.name for f in dataclasses.fields(FARConfig)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise TypeError(f"unknown far.FARConfig field(s) {unknown}; the fields are {', '.join(known)}")
    fields = {k: v for k, v in fields.items() if v is not None}  # attention_retention=None is its default too
    if isinstance(config, FARConfig):
        if fields:
            raise TypeError(
                f"pass either a far.FARConfig or its fields as keywords, not both (got a config and {sorted(fields)}); "
                "dataclasses.replace(config, ...) changes a field"
            )
        return config
    if config is not UNSET:
        if "retention" in fields:
            raise TypeError("retention is given twice: as the second argument and as retention=")
        fields["retention"] = config  # a number, or something FARConfig refuses with a clear message
    return FARConfig(**fields)
