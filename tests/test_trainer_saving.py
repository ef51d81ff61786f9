"""FARTrainer: its folders are plain Hugging Face models with the FAR layout beside them, and resume from anywhere."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ARCHITECTURES, tiny_batch, tiny_examples, tiny_model
from safetensors import safe_open
from test_trainer_callback import arguments
from transformers import AutoModelForSequenceClassification

import far
from far.saving.pretrained import is_far_folder, load_folder
from far.training.trainer import FARTrainer

PRIMING, STEPS = 3, 8  # the switch is at the end of step 3


def far_run(output_dir, resume=None) -> FARTrainer:
    """A FARTrainer run of the tiny BERT (dropout on, seeded) with a checkpoint after every step."""
    trainer = FARTrainer(
        model=tiny_model("bert"),
        args=arguments(output_dir, max_steps=STEPS, save_strategy="steps", save_steps=1),
        train_dataset=tiny_examples(),
        callbacks=[far.FARCallback(retention=0.5, priming=PRIMING)],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> FARTrainer:
    """The uninterrupted run, with its checkpoints."""
    return far_run(tmp_path_factory.mktemp("whole"))


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


def far_records(trainer: FARTrainer) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("far")} for r in trainer.state.log_history if "step" in r]


def test_saved_folders_load_with_plain_transformers_into_the_same_predictions(whole, tmp_path):
    model, batch = whole.model, tiny_batch()
    assert far.is_reconfigured(model)  # saving did not change the live model
    expected = logits(model, batch)
    final = tmp_path / "final"
    whole.save_model(str(final))
    last = Path(whole.args.output_dir) / f"checkpoint-{STEPS}"
    for folder in (final, last):
        with safe_open(folder / "model.safetensors", framework="pt") as f:
            assert not [k for k in f.keys() if "learner" in k or "frozen" in k or "node_order" in k]
        assert "far" not in json.loads((folder / "config.json").read_text())
        plain = AutoModelForSequenceClassification.from_pretrained(folder)
        assert not far.is_reconfigured(plain)
        assert torch.allclose(logits(plain, batch), expected, rtol=0, atol=1e-6)
        # far.from_pretrained gives the reconfigured model back, learners and all
        again = far.from_pretrained(folder)
        assert far.get_config(again) == far.get_config(model)
        assert all(torch.equal(far.learners(again)[k], v) for k, v in far.learners(model).items())
        assert torch.allclose(logits(again, batch), expected, rtol=0, atol=1e-6)
        # ... and the learners file applies to the stock model every user already has
        user = far.load_learners(tiny_model("bert"), folder / "learners.safetensors")
        assert torch.allclose(logits(user, batch), expected, rtol=0, atol=1e-6)
    # A checkpoint inside priming is the plain primed model, with the Primer's snapshot beside it.
    priming = Path(whole.args.output_dir) / "checkpoint-1"
    assert (priming / "far_primer.safetensors").is_file() and not is_far_folder(priming)
    assert not far.is_reconfigured(far.from_pretrained(priming))


def test_a_plain_model_saved_over_a_far_folder_leaves_no_stale_layout(whole, tmp_path):
    whole.save_model(str(tmp_path))
    assert is_far_folder(tmp_path)
    FARTrainer(model=tiny_model("bert"), args=arguments(tmp_path / "other")).save_model(str(tmp_path))
    assert not is_far_folder(tmp_path) and not (tmp_path / "learners.safetensors").exists()
    assert not far.is_reconfigured(far.from_pretrained(tmp_path))


@pytest.mark.parametrize("step", [1, PRIMING, PRIMING + 2], ids=["inside-priming", "at-the-switch", "later"])
def test_resuming_from_any_checkpoint_gives_the_uninterrupted_run(whole, tmp_path, step):
    checkpoint = f"{whole.args.output_dir}/checkpoint-{step}"
    resumed = far_run(tmp_path, resume=checkpoint)
    assert resumed.state.global_step == STEPS
    expected, got = whole.model.state_dict(), resumed.model.state_dict()
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(got[name].float(), value.float(), rtol=0, atol=1e-6), name
    assert far_records(resumed) == far_records(whole)  # the switch is reported once, at its step


def test_resume_from_checkpoint_true_takes_the_last_checkpoint(whole, tmp_path):
    shutil.copytree(whole.args.output_dir, tmp_path, dirs_exist_ok=True)  # the same seeded run's checkpoints
    for step in range(PRIMING + 3, STEPS + 1):  # as if killed after the checkpoint of step 5
        shutil.rmtree(tmp_path / f"checkpoint-{step}")
    resumed = far_run(tmp_path, resume=True)
    for name, value in whole.model.state_dict().items():
        assert torch.allclose(resumed.model.state_dict()[name].float(), value.float(), rtol=0, atol=1e-6), name


def test_the_best_model_is_chosen_among_checkpoints_after_the_switch(tmp_path):
    calls = itertools.count()

    def later_is_worse(prediction) -> dict:  # the first evaluation (step 1, inside priming) is the best
        return {"rank": float(next(calls))}

    trainer = FARTrainer(
        model=tiny_model("bert"),
        args=arguments(
            tmp_path,
            max_steps=STEPS,
            save_strategy="steps",
            save_steps=1,
            eval_strategy="steps",
            eval_steps=1,
            load_best_model_at_end=True,
            metric_for_best_model="rank",
            greater_is_better=False,
        ),
        train_dataset=tiny_examples(),
        eval_dataset=tiny_examples(6, seed=1),
        compute_metrics=later_is_worse,
        callbacks=[far.FARCallback(retention=0.5, priming=PRIMING)],
    )
    trainer.train()
    # Not checkpoint-1 (the primed plain model): the first evaluation after the switch.
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{PRIMING}")
    best = far.from_pretrained(trainer.state.best_model_checkpoint)
    assert far.is_reconfigured(trainer.model)
    got = trainer.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in best.state_dict().items())


def test_a_checkpoint_from_before_the_switch_never_loads_into_a_reconfigured_model(whole):
    model = far.from_pretrained(f"{whole.args.output_dir}/checkpoint-{STEPS}")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="before FAR's switch.*would mix them"):
        load_folder(model, f"{whole.args.output_dir}/checkpoint-1")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    other = far.reconfigure(tiny_model("bert"), retention=0.5, selection="random", seed=3)
    with pytest.raises(ValueError, match="other learners"):
        load_folder(other, f"{whole.args.output_dir}/checkpoint-{STEPS}")


CONFIGS = {
    "ffns": far.FARConfig(0.5, selection="random"),
    "heads-and-depth": far.FARConfig(0.5, selection="random", attention_retention=0.5, freeze_layers=1),
    "frozen-embeddings": far.FARConfig(0.5, selection="random", freeze_embeddings=True),
}


# Every architecture (GPT-2's Conv1D, gated MLPs, ...); heads and depth on one (test_attention_split.py: all).
CASES = [(arch, name) for arch in ARCHITECTURES for name in ("ffns", "frozen-embeddings")] + [
    ("bert", "heads-and-depth")
]


@pytest.mark.parametrize(("arch", "name"), CASES)
def test_a_reconfigured_model_saves_plain_and_comes_back(arch, name, tmp_path):
    config = CONFIGS[name]
    model = far.reconfigure(tiny_model(arch), config)
    batch = tiny_batch()
    expected, state = logits(model, batch), {k: v.clone() for k, v in model.state_dict().items()}
    FARTrainer(model=model, args=arguments(tmp_path / "run")).save_model(str(tmp_path))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())  # the live model is untouched
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert torch.allclose(logits(plain, batch), expected, rtol=0, atol=1e-6)
    again = far.from_pretrained(tmp_path)
    assert far.get_config(again) == config
    assert [n for n, p in again.named_parameters() if p.requires_grad] == [
        n for n, p in model.named_parameters() if p.requires_grad
    ]
    # into a live plain model, as resuming does; and into one reconfigured the same way, as the best model does
    for target in (tiny_model(arch, seed=7), far.reconfigure(tiny_model(arch, seed=7), config)):
        load_folder(target, tmp_path)
        assert target.state_dict().keys() == state.keys()
        assert all(torch.equal(target.state_dict()[k], v) for k, v in state.items())
