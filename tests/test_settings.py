"""RunSettings carries one TrainOptions: every option the settings hold reaches far.finetune, none is copied by hand."""

from __future__ import annotations

import dataclasses

import pytest

from far.recipes.settings import GLUE_DEFAULTS, PROMPT_DEFAULTS, SQUAD_DEFAULTS, RunSettings
from far.training.options import LEARNING_RATES, TrainOptions

# A value other than the default for each option the settings pass on under the same name.
CHANGED = dict(
    priming=5,
    priming_scores="gradient",
    reset_frozen=False,
    prime_frozen=True,
    weight_decay=0.01,
    grad_accum=2,
    bf16=True,
    seed=3,
    mezo_eps=0.01,
    mezo_directions=2,
    eval_every=7,
    checkpoint_every=9,
    progress=False,
    group_by_length=True,
    eval_batch_size=8,
)


def options(**given) -> TrainOptions:
    settings = RunSettings(max_steps=20, **given)
    return settings.train_options(settings.hyperparameters(GLUE_DEFAULTS))


def test_every_option_the_settings_hold_reaches_the_training_options():
    shared = {f.name for f in dataclasses.fields(TrainOptions)} & {f.name for f in dataclasses.fields(RunSettings)}
    hyperparameters = {"lr", "epochs", "max_steps", "batch_size", "max_length", "warmup"}
    built = {"optimizer", "freeze_embeddings", "freeze_layers", "precision", "memory_budget", "cache_frozen", "layout"}
    assert shared - hyperparameters - built == set(CHANGED)
    default = options()
    for name, value in CHANGED.items():
        assert getattr(default, name) != value and getattr(options(**{name: value}), name) == value, name


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (dict(bf16=True, precision="fp32"), "bf16"),  # --bf16 asks for bf16, whatever --precision says
        (dict(precision="auto"), "auto"),
        (dict(method="full", freeze_layers=1, freeze_embeddings=True), "fp32"),
    ],
)
def test_the_options_built_from_the_settings(given, expected):
    built = options(**given)
    assert built.requested_precision == expected
    if given.get("method") == "full":  # without a surgery, plain freezing
        assert (built.config, built.freeze_layers, built.freeze_embeddings) == (None, 1, True)
    assert (
        RunSettings(optimizer="zo-batched").options.optimizer == "mezo"
    )  # MeZO's ranges hold for the batched estimator
    settings = RunSettings(max_steps=20, **given)
    assert settings.train_options(settings.hyperparameters(GLUE_DEFAULTS)).config is settings.far


def test_the_tasks_learning_rates_come_from_the_one_table():
    assert GLUE_DEFAULTS["adamw"]["lr"] == LEARNING_RATES["encoder"]["adamw"] == 1e-4
    assert SQUAD_DEFAULTS["mezo"]["lr"] == LEARNING_RATES["encoder QA"]["mezo"]
    assert PROMPT_DEFAULTS["mezo"]["lr"] == LEARNING_RATES["causal LM prompts"]["mezo"] == 1e-4
    assert LEARNING_RATES["finetune"] == {"adamw": 5e-5, "sgd": 1e-3, "mezo": 1e-6}  # far.finetune's, documented
