"""The command line plans a budget before anything loads; `far.finetune` plans it again with the model loaded.
Both read the same rules from the run's `TrainOptions` (what priming trains, what is frozen from the first step),
so for every way of asking for a frozen bottom they plan the same run."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from conftest import tiny_causal_lm
from transformers import BertForSequenceClassification

import far
from far.cli.common import budget_plan
from far.recipes.settings import GLUE_DEFAULTS, RunSettings
from far.training.options import TrainOptions

LENGTH = 16
COMBINATIONS = list(
    itertools.product(
        ("far", "random"),  # random selection without "auto" has no priming
        (True, False),  # reset_frozen
        (None, True, False),  # prime_frozen
        (None, 1, "auto"),  # freeze_layers
        (True, False),  # freeze_embeddings
    )
)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir).eval()


def examples(n: int = 8) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(3, 1000, (LENGTH,), generator=generator),
            "attention_mask": torch.ones(LENGTH, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(("method", "reset_frozen", "prime_frozen", "depth", "embeddings"), COMBINATIONS)
def test_the_command_lines_plan_is_the_trainers(
    base, tiny_model_dir, method, reset_frozen, prime_frozen, depth, embeddings
):
    settings = RunSettings(
        model=str(tiny_model_dir),
        method=method,
        retention=0.5,
        freeze_layers=depth,
        freeze_embeddings=embeddings,
        reset_frozen=reset_frozen,
        prime_frozen=prime_frozen,
        memory_budget=1e6,  # ample: no lever is needed, so the plan shows the rules alone
        max_steps=4,
        batch_size=4,
        max_length=LENGTH,
        progress=False,
        runtime="transformers",
    )
    planned = budget_plan(settings, GLUE_DEFAULTS, reads_datasets=False)
    result = far.finetune(
        copy.deepcopy(base), examples(), options=settings.train_options(settings.hyperparameters(GLUE_DEFAULTS))
    )
    trained = result.memory_plan
    for field in ("early_frozen_embeddings", "recompute_activations", "recompute_layers", "micro_tokens", "seq_len"):
        assert getattr(planned, field) == trained[field], field
    options = settings.train_options(settings.hyperparameters(GLUE_DEFAULTS))
    assert planned.early_frozen_embeddings == (
        options.frozen_from_start or (options.config.freeze_embeddings and not options.primes)
    )
    assert (result.priming_steps > 0) == options.primes


def test_options_are_given_once(base):
    options = TrainOptions(None, max_steps=2)
    with pytest.raises(TypeError, match="give the training options once"):
        far.finetune(copy.deepcopy(base), examples(), options=options, lr=1e-3)
    with pytest.raises(TypeError, match="give the training options once"):
        far.finetune(copy.deepcopy(base), examples(), far.FARConfig(0.4), options=options)


def test_a_budget_for_a_causal_lm_is_refused_before_training():
    model = tiny_causal_lm()
    ids = torch.randint(3, 90, (6,))
    with pytest.raises(ValueError, match="plans encoder runs"):
        far.finetune(model, [{"input_ids": ids, "labels": ids}], None, memory_budget=2048, max_steps=1)
    with pytest.raises(ValueError, match="plans encoder runs"):
        RunSettings(model="smollm2-135m", method="far", optimizer="mezo", memory_budget=640)


def test_the_refusal_says_where_a_causal_lms_budget_goes_on_every_path_that_reaches_it():
    """`far train` on texts plans a causal LM's budget (far.llm.text_budget): the message must not deny it."""
    model, ids = tiny_causal_lm(), torch.randint(3, 90, (6,))
    refusals = []
    for attempt in (
        lambda: far.finetune(model, [{"input_ids": ids, "labels": ids}], None, memory_budget=2048, max_steps=1),
        lambda: RunSettings(model="smollm2-135m", method="far", optimizer="mezo", memory_budget=640),
    ):
        with pytest.raises(ValueError) as refused:
            attempt()
        refusals.append(str(refused.value))
    for message in refusals:
        assert "far train" in message and "--memory-budget" in message and "TextRun" in message, message
        assert "leave the budget out for this model" not in message, message
