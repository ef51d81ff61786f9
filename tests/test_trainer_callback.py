"""transformers.Trainer: a reconfigured model trains and saves through it; FARCallback primes inside a run."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_examples, tiny_model
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback, TrainingArguments

import far
from far.surgery import learners_from_state_dict, reconfigure_with_learners


def arguments(output_dir, max_steps: int = 6, **kwargs) -> TrainingArguments:
    options = dict(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        weight_decay=0.1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_pin_memory=False,
    )
    return TrainingArguments(**(options | kwargs))


def frozen(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def optimizer_params(trainer: Trainer) -> set[int]:
    return {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}


@pytest.mark.slow
def test_a_reconfigured_model_trains_and_saves_through_trainer(tmp_path):
    model = far.reconfigure(tiny_model("bert"), retention=0.4, selection="random")
    frozen_before, trainable_before = frozen(model), trainable(model)
    trainer = Trainer(model=model, args=arguments(tmp_path, max_steps=4), train_dataset=tiny_examples())
    trainer.train()
    assert all(torch.equal(p, frozen_before[n]) for n, p in frozen(model).items())
    assert all(not torch.equal(p, trainable_before[n]) for n, p in trainable(model).items() if "embeddings" not in n)
    assert optimizer_params(trainer) == {id(p) for p in model.parameters() if p.requires_grad}

    trainer.save_model(str(tmp_path / "saved"))
    state = load_file(str(tmp_path / "saved" / "model.safetensors"))
    reloaded = tiny_model("bert", seed=7)
    reconfigure_with_learners(reloaded, learners_from_state_dict(reloaded, state), far.get_config(model))
    reloaded.load_state_dict(state)
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


class Recorder(TrainerCallback):
    """Frozen tensors after every step once the model is reconfigured, and the learners at the switch."""

    def __init__(self):
        self.frozen: list[dict[str, torch.Tensor]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if far.is_reconfigured(model):
            self.frozen.append(frozen(model))
            if len(self.frozen) == 1:
                self.learners_at_switch = trainable(model)


@pytest.mark.slow
def test_far_callback_primes_then_reconfigures_inside_the_run(tmp_path):
    model = tiny_model("bert")
    callback, recorder = far.FARCallback(retention=0.5, priming=2), Recorder()
    trainer = Trainer(
        model=model, args=arguments(tmp_path), train_dataset=tiny_examples(), callbacks=[callback, recorder]
    )
    trainer.train()
    assert far.is_reconfigured(model) and callback.priming_steps == 2
    assert len(recorder.frozen) == 5  # steps 2..6: reconfigured at the end of step 2
    for snapshot in recorder.frozen[1:]:
        assert all(torch.equal(v, recorder.frozen[0][n]) for n, v in snapshot.items())
    moved = [not torch.equal(p, recorder.learners_at_switch[n]) for n, p in trainable(model).items() if "learner" in n]
    assert moved and all(moved)
    # The Trainer's own optimizer now holds exactly the trainable tensors, state only for them,
    # learner weights decayed and learner biases not (like the weights and biases they came from).
    params = optimizer_params(trainer)
    assert params == {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in trainer.optimizer.state} <= params
    split = model.bert.encoder.layer[0].intermediate.dense
    decay_of = {id(p): g["weight_decay"] for g in trainer.optimizer.param_groups for p in g["params"]}
    assert decay_of[id(split.learner_weight)] == 0.1 and decay_of[id(split.learner_bias)] == 0.0
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0  # the schedule ran on to its end


def test_far_callback_with_random_selection_reconfigures_at_the_start(tmp_path):
    model = tiny_model("bert")
    callback, recorder = far.FARCallback(retention=0.5, selection="random"), Recorder()
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=2),
        train_dataset=tiny_examples(),
        callbacks=[callback, recorder],
    )
    trainer.train()
    assert callback.priming_steps == 0 and len(recorder.frozen) == 2
    assert all(torch.equal(v, recorder.frozen[0][n]) for n, v in recorder.frozen[1].items())
    assert optimizer_params(trainer) == {id(p) for p in model.parameters() if p.requires_grad}


def test_trainer_resume_after_the_switch(tmp_path):
    run_dir = tmp_path / "run"
    whole = tiny_model("bert")
    args = arguments(run_dir, save_strategy="steps", save_steps=4)
    Trainer(
        model=whole, args=args, train_dataset=tiny_examples(), callbacks=[far.FARCallback(retention=0.5, priming=2)]
    ).train()

    model = tiny_model("bert")
    callback = far.FARCallback(retention=0.5, priming=2)
    trainer = Trainer(model=model, args=args, train_dataset=tiny_examples(), callbacks=[callback])
    callback.restore_layout(model, run_dir / "checkpoint-4")
    trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    for (name, a), b in zip(whole.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-6), name


def test_far_callback_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match=r"retention must be in \(0, 1\]"):
        far.FARCallback(retention=0.0)
    with pytest.raises(ValueError, match="priming must be a fraction"):
        far.FARCallback(priming=1.5)
    with pytest.raises(ValueError, match="needs priming scores"):
        far.FARCallback(priming=0)
    model = tiny_model("bert")
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=3),
        train_dataset=tiny_examples(),
        callbacks=[far.FARCallback(priming=3)],
    )
    with pytest.raises(ValueError, match="priming must be shorter"):
        trainer.train()
    assert not far.is_reconfigured(model)
    with pytest.raises(ValueError, match="no model.safetensors"):
        far.FARCallback().restore_layout(model, tmp_path)
