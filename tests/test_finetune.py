"""far.finetune: priming → surgery → training with AdamW or MeZO; logs, result, schedule, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_CONFIGS, tiny_examples, tiny_model
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

import far
from far.training.checkpoint import read_checkpoint
from far.training.schedule import WarmupLinear


class FrozenRecorder:
    """An eval_fn that records the frozen tensors after every step, once the model is reconfigured."""

    def __init__(self):
        self.seen: list[dict[str, torch.Tensor]] = []

    def __call__(self, model):
        if far.is_reconfigured(model):
            self.seen.append({n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad})
        return {"n_frozen": float(sum(not p.requires_grad for p in model.parameters()))}


@pytest.mark.parametrize("optimizer, lr", [("adamw", 1e-2), ("mezo", 1e-2)])
def test_far_training_moves_learners_only(tmp_path, optimizer, lr):
    model = tiny_model("bert")
    recorder = FrozenRecorder()
    result = far.finetune(
        model,
        tiny_examples(),
        optimizer=optimizer,
        lr=lr,
        config=far.FARConfig(retention=0.4),
        priming=2,
        max_steps=8,
        batch_size=6,
        weight_decay=0.1,
        eval_fn=recorder,
        eval_every=1,
        output_dir=tmp_path,
        checkpoint_every=8,
        progress=False,
    )
    assert far.is_reconfigured(model) and far.get_config(model).retention == 0.4
    assert result.priming_steps == 2 and result.steps == 8
    # Frozen tensors are bit-identical from the surgery (end of step 2) to the end, despite weight decay.
    assert len(recorder.seen) == 7
    for snapshot in recorder.seen[1:]:
        for name, value in snapshot.items():
            assert torch.equal(value, recorder.seen[0][name]), name
    split = model.bert.encoder.layer[0].intermediate.dense
    assert split.learner_weight.requires_grad and not split.frozen_weight.requires_grad
    # The run is deterministic: a second identical run reaches the same learner weights.
    reference = tiny_model("bert")
    far.finetune(
        reference,
        tiny_examples(),
        optimizer=optimizer,
        lr=lr,
        priming=2,
        max_steps=8,
        batch_size=6,
        weight_decay=0.1,
        config=far.FARConfig(retention=0.4),
        progress=False,
    )
    assert torch.equal(reference.bert.encoder.layer[0].intermediate.dense.learner_weight, split.learner_weight)
    # The optimizer of the training phase holds state for trainable tensors only.
    trainable = [p for p in model.parameters() if p.requires_grad]
    with safe_open(read_checkpoint(tmp_path).path / "optimizer.safetensors", framework="pt") as f:
        names, saved = json.loads(f.metadata()["names"]), {key: f.get_tensor(key) for key in f.keys()}
    assert len(names) == len(trainable)
    if optimizer == "adamw":
        moments = [t for key, t in saved.items() if key.startswith("exp_avg:")]
        assert len(moments) == len(trainable) == len(saved) // 2
        assert sorted(tuple(t.shape) for t in moments) == sorted(tuple(p.shape) for p in trainable)


def test_learners_change_after_the_surgery():
    model = tiny_model("bert")
    snapshots = []

    def eval_fn(m):
        if far.is_reconfigured(m):
            snapshots.append(m.bert.encoder.layer[1].output.dense.learner_weight.detach().clone())
        return {}

    far.finetune(
        model,
        tiny_examples(),
        lr=1e-2,
        priming=2,
        max_steps=5,
        batch_size=6,
        eval_fn=eval_fn,
        eval_every=1,
        progress=False,
    )
    assert len(snapshots) == 4 and not torch.equal(snapshots[0], snapshots[-1])


def test_full_finetuning_and_freeze_ffn_ablation():
    model = tiny_model("bert")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = far.finetune(model, tiny_examples(), None, lr=1e-2, max_steps=3, batch_size=8, progress=False)
    assert not far.is_reconfigured(model) and result.priming_steps == 0
    assert result.trainable_parameters == result.total_parameters
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters() if "embeddings" not in n)

    model = tiny_model("bert")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = far.finetune(
        model, tiny_examples(), None, freeze_ffn=True, lr=1e-2, max_steps=3, batch_size=8, progress=False
    )
    ffn_names = [n for n in before if ".intermediate.dense." in n or ".output.dense." in n and "attention" not in n]
    assert ffn_names and all(torch.equal(model.get_parameter(n), before[n]) for n in ffn_names)
    assert result.trainable_parameters < result.total_parameters


def test_random_selection_skips_priming_and_global_rng_is_untouched():
    model = tiny_model("bert")
    state = torch.get_rng_state()
    result = far.finetune(
        model, tiny_examples(), far.FARConfig(0.5, "random"), max_steps=3, batch_size=8, progress=False
    )
    assert torch.equal(torch.get_rng_state(), state)
    assert result.priming_steps == 0 and result.priming_seconds >= 0 and far.is_reconfigured(model)
    assert far.get_config(model).selection == "random"


def test_log_result_and_schedule_spanning_priming_and_training(tmp_path):
    model = tiny_model("bert")
    result = far.finetune(
        model,
        tiny_examples(),
        lr=1e-3,
        priming=3,
        max_steps=10,
        warmup=2,
        batch_size=4,
        grad_accum=2,
        eval_fn=lambda m: {"score": 0.5},
        eval_every=4,
        output_dir=tmp_path,
        progress=False,
    )
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 11))
    assert [r["phase"] for r in lines] == ["priming"] * 3 + ["training"] * 7
    schedule = WarmupLinear(10, 2)
    assert [r["lr"] for r in lines] == pytest.approx([1e-3 * schedule(s) for s in range(10)])
    assert "trainable_parameters" in lines[2] and [r["step"] for r in lines if "eval" in r] == [4, 8, 10]
    for r in lines:
        assert r["peak_rss_bytes"] > 0 and r["elapsed"] > 0 and (r["loss"] is None or math.isfinite(r["loss"]))
    assert result.metrics == {"score": 0.5} and [h["step"] for h in result.history] == [4, 8, 10]
    assert result.log_path == str(tmp_path / "log.jsonl")
    parts = result.priming_seconds + result.training_seconds + result.eval_seconds
    assert 0 < parts <= result.total_seconds and result.peak_rss_bytes > 10**7
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == 10
    assert result.to_dict()["trainable_parameters"] == result.trainable_parameters


def test_mezo_priming_and_sgd_priming_options():
    for priming_optimizer in ("mezo", "sgd"):
        model = tiny_model("bert")
        result = far.finetune(
            model,
            tiny_examples(),
            optimizer="mezo",
            priming_optimizer=priming_optimizer,
            priming=2,
            max_steps=4,
            batch_size=8,
            progress=False,
        )
        assert far.is_reconfigured(model) and result.priming_steps == 2 and math.isfinite(result.final_loss)


def test_causal_lm_with_custom_loss_and_bf16():
    config = AutoConfig.for_model("llama", **TINY_CONFIGS["llama"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    data = [{"input_ids": ids} for ids in torch.randint(3, 97, (12, 9), generator=torch.Generator().manual_seed(0))]

    def loss_fn(m, batch):
        logits = m(input_ids=batch["input_ids"]).logits[:, :-1]  # (B, T-1, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["input_ids"][:, 1:].flatten())

    for optimizer in ("adamw", "mezo"):
        result = far.finetune(
            model if optimizer == "adamw" else far.restore(model),
            data,
            optimizer=optimizer,
            loss_fn=loss_fn,
            bf16=True,
            priming=1,
            max_steps=3,
            batch_size=4,
            progress=False,
        )
        assert math.isfinite(result.final_loss) and far.is_reconfigured(model)


def test_datasets_dataset_with_padding_collator(minilm_path):
    datasets = pytest.importorskip("datasets")
    from transformers import AutoTokenizer, DataCollatorWithPadding

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    generator = torch.Generator().manual_seed(0)
    rows = [
        torch.randint(3, 97, (int(n),), generator=generator).tolist()
        for n in torch.randint(3, 9, (16,), generator=generator)
    ]
    data = datasets.Dataset.from_dict({"input_ids": rows, "labels": [i % 3 for i in range(16)]})
    model = tiny_model("bert")
    result = far.finetune(
        model, data, collate_fn=DataCollatorWithPadding(tokenizer), max_steps=3, batch_size=5, priming=1, progress=False
    )
    assert math.isfinite(result.final_loss)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(lr=0.0), ValueError, "lr must be a finite number > 0"),
        (dict(lr=-1e-5), ValueError, "lr must be a finite number > 0"),
        (dict(optimizer="mezo", mezo_eps=0.0), ValueError, "mezo_eps must be a finite number > 0"),
        (dict(config=0.0), ValueError, r"retention must be in \(0, 1\]"),
        (dict(config=1.5), ValueError, r"retention must be in \(0, 1\]"),
        (dict(optimizer="adam"), ValueError, "optimizer must be one of 'adamw', 'sgd', 'mezo'"),
        (dict(priming_optimizer="lion"), ValueError, "priming_optimizer must be one of"),
        (dict(priming=12), ValueError, "priming must be shorter than the run"),
        (dict(priming=1.5), ValueError, r"fraction of the steps in \[0, 1\)"),
        (dict(priming=0), ValueError, "priming must be > 0"),
        (dict(config="best"), TypeError, "retention must be a number"),
        (
            dict(config=far.FARConfig(0.4), freeze_embeddings=True),
            ValueError,
            r"set FARConfig\(freeze_embeddings=True\)",
        ),
        (dict(batch_size=0), ValueError, "batch_size must be an int >= 1"),
        (dict(grad_accum=0), ValueError, "grad_accum must be an int >= 1"),
        (dict(warmup=20), ValueError, "warmup must be shorter than the run"),
        (dict(eval_every=2), ValueError, "eval_every needs an eval_fn"),
        (dict(checkpoint_every=2), ValueError, "checkpoint_every needs an output_dir"),
        (dict(freeze_ffn=True), ValueError, "use it with config=None"),
        (dict(loss_fn="mse"), TypeError, "loss_fn must be callable"),
        (dict(epochs=0), ValueError, "epochs must be a finite number > 0"),
    ],
)
def test_bad_input_is_refused_before_training(kwargs, error, message):
    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    options = dict(max_steps=12, batch_size=4, progress=False) | kwargs
    if "epochs" in kwargs:
        del options["max_steps"]
    with pytest.raises(error, match=message):
        far.finetune(model, tiny_examples(), **options)
    assert not far.is_reconfigured(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_bad_data_and_models_are_refused():
    with pytest.raises(ValueError, match="train_data is empty"):
        far.finetune(tiny_model("bert"), [], progress=False)
    with pytest.raises(TypeError, match="map-style dataset"):
        far.finetune(tiny_model("bert"), (x for x in tiny_examples()), progress=False)
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.finetune("bert", tiny_examples(), progress=False)
    model = far.reconfigure(tiny_model("bert"), retention=0.5, selection="random")
    with pytest.raises(ValueError, match="already reconfigured"):
        far.finetune(model, tiny_examples(), max_steps=4, progress=False)


def test_existing_run_in_output_dir_is_not_overwritten(tmp_path):
    far.finetune(
        tiny_model("bert"),
        tiny_examples(),
        max_steps=3,
        priming=1,
        batch_size=8,
        output_dir=tmp_path,
        checkpoint_every=3,
        progress=False,
    )
    with pytest.raises(ValueError, match="already holds a run's checkpoints"):
        far.finetune(
            tiny_model("bert"),
            tiny_examples(),
            max_steps=3,
            priming=1,
            batch_size=8,
            output_dir=tmp_path,
            progress=False,
        )


def test_the_surgery_keywords_of_old_still_work_with_a_deprecation_warning():
    old, new = tiny_model("bert"), tiny_model("bert")
    options = dict(max_steps=3, batch_size=8, lr=1e-2, progress=False)
    with pytest.warns(DeprecationWarning, match=r"config=far.FARConfig"):
        far.finetune(old, tiny_examples(), retention=0.5, selection="random", seed=3, **options)
    far.finetune(new, tiny_examples(), far.FARConfig(0.5, "random", seed=3), seed=3, **options)
    assert far.get_config(old) == far.get_config(new)
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(TypeError, match="not both"), pytest.warns(DeprecationWarning):
        far.finetune(tiny_model("bert"), tiny_examples(), far.FARConfig(0.5), retention=0.4, **options)
    with pytest.raises(TypeError, match="unexpected keyword"):
        far.finetune(tiny_model("bert"), tiny_examples(), retentoin=0.4, **options)
