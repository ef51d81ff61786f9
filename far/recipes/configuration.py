"""Which FAR configuration a training run trains with, and why: what its metrics.json records.

A training command's four configuration flags (`--retention`, `--freeze-embeddings`,
`--freeze-layers`, `--cache-frozen`) each arrive as given or as None (not given), and
`choose_configuration` settles them in one place:

- `--method far` with none of them runs FAR's automatic configuration (`far.FARConfig.auto()`,
  the frozen bottom kept: "auto"), except under `--memory-budget`, which plans for a fixed
  retention and no kept bottom: there the paper's ("paper").
- `--retention` given says the whole configuration flag by flag: the other three are off unless
  given (`--retention 0.4` is the paper's fixed retention, nothing else frozen).
- `--preset auto|paper` names a configuration; a flag given beside it changes that field only.
- `--layout FILE` (a layout `far prime` wrote) sets the configuration whole ("layout"): its config, the frozen
  bottom's output kept where it freezes one; a configuration flag beside it is refused.
- Other methods, and a GGUF causal LM (whose lean runtime has its own default,
  `far.llm.lean_far`), take the flags as given.

    >>> fields, configuration = choose_configuration(UNGIVEN, preset=None, method="far", model="minilm")
    >>> configuration.name, fields["freeze_layers"]
    ('auto', 'auto')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from far.config import AUTO, PRESETS, UNSET, FARConfig
from far.methods import METHODS
from far.models import is_causal_lm
from far.saving.layout_file import SharedLayout

# The run's configuration fields (RunSettings' names) and their flags.
FLAGS = {
    "retention": "--retention",
    "freeze_embeddings": "--freeze-embeddings",
    "freeze_layers": "--freeze-layers",
    "cache_frozen": "--cache-frozen",
}
UNGIVEN: Mapping[str, object] = dict.fromkeys(FLAGS)  # nothing given on the command line
# What a field is when neither a flag nor a preset sets it (retention None: the run's default, far.recipes.settings).
OFF: Mapping[str, object] = dict(retention=None, freeze_embeddings=False, freeze_layers=None, cache_frozen=False)


def preset_fields(name: str) -> dict:
    """The run's configuration fields of the named configuration (`far.config.PRESETS`)."""
    return _config_fields(FARConfig.preset(name))


def _config_fields(config: FARConfig) -> dict:
    # a FARConfig's fields, and the frozen bottom's output kept where it freezes one
    return {
        "retention": config.retention,
        "freeze_embeddings": config.freeze_embeddings,
        "freeze_layers": config.freeze_layers,
        "cache_frozen": config.freezes_depth,
    }


@dataclass(frozen=True)
class Configuration:
    """Which configuration a run trains with and why: "auto", "paper", "custom" (given flag by flag), "none"
    (no FAR surgery, nothing frozen) or "causal-lm" (the lean runtime's default), with the reason."""

    name: str
    why: str

    def record(self, retention: object, *, frozen_layers: object, freeze_embeddings: bool, cache_frozen: bool) -> dict:
        """metrics.json's "configuration": the name, why, and what it set (the depth as trained, "auto" resolved)."""
        return {
            "name": self.name,
            "why": self.why,
            "retention": retention,
            "frozen_layers": frozen_layers,
            "freeze_embeddings": freeze_embeddings,
            "cache_frozen": cache_frozen,
        }


def _named(fields: Mapping[str, object]) -> str:
    """The preset that `fields` are, else "custom"."""
    return next((name for name in PRESETS if preset_fields(name) == dict(fields)), "custom")


def _check_preset(preset: str, *, primes: bool, method: str, model: str, memory_budget: float | None) -> None:
    if preset not in PRESETS:
        raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if not primes:
        raise ValueError(
            f"--preset {preset} configures FAR's surgery from its priming scores, which --method {method} does not "
            "have: use it with --method far, or give the flags themselves"
        )
    if is_causal_lm(model):
        raise ValueError(
            f"--preset {preset} configures an encoder's run; a GGUF causal LM's lean runtime has its own default "
            "(MeZO + FAR on a share of the top layers' nodes): drop --preset, or give --retention/--freeze-layers"
        )
    if preset == AUTO and memory_budget is not None:
        raise ValueError(
            "--preset auto chooses the retention and the depth from the priming scores and keeps the frozen bottom's "
            "output, which --memory-budget does not plan for: use --preset paper with it, or no budget"
        )


def _layout_fields(given: Mapping[str, object], layout: SharedLayout, preset: str | None, method: str) -> dict:
    """The configuration fields of a run trained with a shared layout: the layout's; a flag beside it is refused."""
    flags = [FLAGS[k] for k in ("retention", "freeze_embeddings", "freeze_layers") if given.get(k) is not None]
    if method != "far" or preset is not None or flags:
        beside = " ".join(flags + ([] if preset is None else ["--preset"]))
        raise ValueError(
            "--layout sets FAR's surgery as far prime chose it: use it with --method far"
            + (f", and drop {beside}" if beside else "")
        )
    fields = _config_fields(layout.config)
    if given.get("cache_frozen") is not None:
        fields["cache_frozen"] = given["cache_frozen"]
    return fields


def choose_configuration(
    given: Mapping[str, object],
    *,
    preset: str | None,
    method: str,
    model: str,
    memory_budget: float | None = None,
    layout: SharedLayout | None = None,
) -> tuple[dict, Configuration]:
    """The run's four configuration fields (as `RunSettings` takes them) and the `Configuration` they make.

    `given`: `FLAGS`' fields as the command line gave them, None where not given; the keywords are the run's
    `--preset`, `--method`, `--model`, `--memory-budget` and `--layout` (read: its configuration, whole).

    Raises:
        ValueError: a preset where it cannot apply (a method without FAR's priming, a GGUF causal LM,
            "auto" under a memory budget), saying what to give instead.
    """
    unknown = sorted(set(given) - set(FLAGS))
    if unknown:
        raise ValueError(f"unknown configuration field(s) {unknown}; they are {', '.join(FLAGS)}")
    given = {**UNGIVEN, **given}
    if layout is not None:
        why = f"--layout {layout.path}: the learners and depth far prime chose, no priming step"
        return _layout_fields(given, layout, preset, method), Configuration("layout", why)
    surgery = METHODS[method].far_config(0.4)  # the method's surgery, if it has one
    primes = surgery is not None and surgery.selection != "random"
    causal_lm = is_causal_lm(model)
    flags = " ".join(FLAGS[k] for k, v in given.items() if v is not None)
    if preset is not None:
        _check_preset(preset, primes=primes, method=method, model=model, memory_budget=memory_budget)
        base, why = preset_fields(preset), f"--preset {preset}"
    elif surgery is None:
        base, why = OFF, f"--method {method} has no FAR surgery: the flags as given"
    elif causal_lm:
        base, why = OFF, "a GGUF causal LM: the lean runtime's default (far.llm.lean_far) unless flags say otherwise"
    elif not primes:
        base, why = OFF, f"--method {method} draws its learners without priming scores: the flags as given"
    elif given["retention"] is not None:
        base, why = OFF, "--retention given: the flags as given, nothing else frozen unless asked"
    elif memory_budget is not None:
        base = preset_fields("paper")
        why = "default of --method far under --memory-budget (it plans for a fixed retention)"
    else:
        base, why = preset_fields(AUTO), "default of --method far"
    fields = {k: base[k] if given[k] is None else given[k] for k in FLAGS}
    if base["cache_frozen"] and given["cache_frozen"] is None and fields["freeze_layers"] in (None, 0):
        fields["cache_frozen"] = False  # no frozen bottom to keep (--freeze-layers 0)
    if flags and base is not OFF:
        why += f", changed by {flags}"
    if surgery is None and not any(fields.values()):
        name = "none"
    elif causal_lm:
        name = "custom" if flags else "causal-lm"
    else:
        name = _named(fields)
    return fields, Configuration(name, why)


def configuration_of(settings: object) -> Configuration:
    """The configuration of settings built without `choose_configuration` (a script's `RunSettings`)."""
    fields = {k: getattr(settings, k) for k in FLAGS}
    far_config = getattr(settings, "far", None)
    if far_config is not None:
        fields["retention"] = far_config.retention
    name = "none" if far_config is None and not any(fields.values()) else _named(fields)
    return Configuration(name, "as the run's settings give it")


def configuration_record(settings: object, frozen_layers: object, far_config: FARConfig | None = UNSET) -> dict:
    """metrics.json's "configuration" of a run of `settings` (a `RunSettings`): which configuration ran and why,
    `frozen_layers` the depth as trained, `far_config` the surgery as made where the run settled it itself (the
    lean runtime's default; else the settings')."""
    chosen = getattr(settings, "configuration", None) or configuration_of(settings)
    far_config = getattr(settings, "far", None) if far_config is UNSET else far_config
    record = chosen.record(
        None if far_config is None else far_config.retention,
        frozen_layers=frozen_layers,
        freeze_embeddings=settings.freeze_embeddings if far_config is None else far_config.freeze_embeddings,
        cache_frozen=settings.cache_frozen,
    )
    layout = getattr(settings, "shared_layout", None)
    return record if layout is None else {**record, "layout": layout.describe()}
