"""transformers.Trainer: a reconfigured model trains and saves through it; FARCallback primes inside a run.

FARTrainer's folders and resuming: tests/test_trainer_saving.py; DDP: tests/test_trainer_ddp.py.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import tiny_examples, tiny_model
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import far
from far.surgery import learners_from_state_dict, reconfigure_with_learners
from far.training.trainer import FARTrainer


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


def test_a_plain_trainer_resumes_after_the_switch_through_restore_layout(tmp_path):
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


class Captured(logging.Handler):
    """What FAR says in the Trainer's log, at the Trainer's INFO verbosity."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.verbosity = transformers.utils.logging.get_verbosity()
        transformers.utils.logging.set_verbosity_info()
        logging.getLogger("transformers.trainer.far").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("transformers.trainer.far").removeHandler(self)
        transformers.utils.logging.set_verbosity(self.verbosity)


def test_far_callback_reports_priming_the_switch_learners_and_trainable_parameters(tmp_path):
    model = tiny_model("bert")
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path),
        train_dataset=tiny_examples(),
        callbacks=[far.FARCallback(retention=0.5, priming=2)],
    )
    with Captured() as log:
        trainer.train()
    counts = far.summary(model, verbose=False)
    assert any("priming: the first 2 of 6 optimizer steps" in m for m in log.messages)
    switch = next(m for m in log.messages if "reconfigured at step 2 of 6" in m)
    assert f"trainable params: {counts.trainable_parameters:,}" in switch
    assert "bert.encoder.layer.1.output.dense: 20/40 learner nodes" in switch
    records = [r for r in trainer.state.log_history if any(k.startswith("far_") for k in r)]
    assert records[0] == {"far_priming_steps": 2, "far_max_steps": 6, "epoch": 0, "step": 0}
    assert records[1]["step"] == records[1]["far_switch_step"] == 2
    assert records[1]["far_trainable_parameters"] == counts.trainable_parameters
    assert records[1]["far_total_parameters"] == counts.total_parameters
    assert records[1]["far_learners"] == {f"bert.encoder.layer.{i}.output.dense": [20, 40] for i in range(2)}


def test_far_callback_refuses_to_switch_under_ddp_and_says_how():
    model = tiny_model("bert")
    callback = far.FARCallback(retention=0.5, priming=2)
    with pytest.raises(RuntimeError, match=r"DDP \(2 processes\).*stop_at_switch=True.*torchrun.*resume_from"):
        callback.on_train_begin(SimpleNamespace(world_size=2), TrainerState(max_steps=6), TrainerControl(), model=model)
    assert not far.is_reconfigured(model)
    with pytest.raises(ValueError, match="selection='random' does not prime.*far.reconfigure"):
        far.FARCallback(retention=0.5, selection="random", stop_at_switch=True)


def test_a_plain_trainer_cannot_resume_inside_priming_and_says_what_can(tmp_path):
    args = arguments(tmp_path, save_strategy="steps", save_steps=1, max_steps=3)

    def trainer() -> Trainer:
        callback = far.FARCallback(retention=0.5, priming=2)
        return Trainer(model=tiny_model("bert"), args=args, train_dataset=tiny_examples(), callbacks=[callback])

    with Captured() as log:
        trainer().train()
    # Its checkpoints after the switch hold the split layers: said once, with what to use instead.
    warned = [m for m in log.messages if "split layers" in m]
    assert len(warned) == 1 and "checkpoint-2" in warned[0] and "FARTrainer" in warned[0]
    with pytest.raises(ValueError, match="inside priming.*without the Primer's snapshot.*FARTrainer"):
        trainer().train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    with pytest.raises(ValueError, match="taken during priming.*FARTrainer"):
        far.FARCallback(retention=0.5, priming=2).restore_layout(tiny_model("bert"), tmp_path / "checkpoint-1")

    far_dir = tmp_path / "far"
    FARTrainer(
        model=tiny_model("bert"),
        args=arguments(far_dir, save_strategy="steps", save_steps=1, max_steps=2),
        train_dataset=tiny_examples(),
        callbacks=[far.FARCallback(retention=0.5, priming=1)],
    ).train()
    with pytest.raises(ValueError, match="saved by FARTrainer.*resume it with FARTrainer"):
        far.FARCallback(retention=0.5, priming=1).restore_layout(tiny_model("bert"), far_dir / "checkpoint-1")
