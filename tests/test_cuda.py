"""FAR on a CUDA GPU (Jetson-class devices run CUDA): the surgery's parity, training, MeZO and resume on the device.

Skipped where there is no GPU (CI has none); run on a machine with one: `pytest tests/test_cuda.py`.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import pad, ragged_examples, tiny_batch, tiny_examples, tiny_model

import far
from far.evaluation.labels import LabelEvaluator, TextMetric
from far.training.checkpoint import read_checkpoint

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: run this file on a machine with one"
)
CUDA = torch.device("cuda")
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def on(device: torch.device, batch: dict) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def random_scores(model) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.rand(g.n_nodes, generator=generator) for name, g in far.find_ffns(model).items()}


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_the_rewrite_keeps_the_logits_and_restore_gives_the_model_back_on_cuda(arch):
    model = tiny_model(arch).to(CUDA)
    batch = on(CUDA, tiny_batch())
    with torch.no_grad():
        before = model(**batch).logits
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    far.reconfigure(model, 0.4, scores=random_scores(model))
    assert all(p.device.type == CUDA.type for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, rtol=1e-5, atol=1e-5)
    far.restore(model)
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_backward_gives_gradients_to_learner_rows_only_on_cuda():
    model = tiny_model("bert").to(CUDA)
    far.reconfigure(model, 0.25, scores=random_scores(model))
    model(**on(CUDA, tiny_batch()), labels=torch.tensor([0, 1, 2], device=CUDA)).loss.backward()
    split = [m for m in model.modules() if isinstance(m, far.SplitLinear)]
    assert split and all(m.learner_weight.grad is not None for m in split)
    assert all(m.frozen_weight.grad is None and not m.frozen_weight.requires_grad for m in split)


def test_a_cuda_run_trains_what_a_cpu_run_trains():
    """The same seeded AdamW run (no dropout) on the GPU and on the CPU ends at the same weights, within float error.
    (MeZO draws its directions from the device's generator, so its runs differ by device by design.)"""
    options = dict(optimizer="adamw", priming=2, max_steps=6, batch_size=4, lr=1e-2, progress=False, seed=3)
    models = {}
    for device in ("cpu", "cuda"):
        model = tiny_model("bert", **NO_DROPOUT).to(device)
        far.finetune(model, tiny_examples(16), far.FARConfig(0.4, freeze_embeddings=True), **options)
        models[device] = far.restore(model).cpu()
    for (name, a), b in zip(models["cpu"].state_dict().items(), models["cuda"].state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4, msg=name)


def test_frozen_weights_stay_bit_identical_under_mezo_on_cuda():
    model = tiny_model("bert").to(CUDA)
    far.reconfigure(model, 0.4, scores=random_scores(model), freeze_embeddings=True)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = far.MeZO([p for p in model.parameters() if p.requires_grad], lr=1e-2, eps=1e-3, seed=0)
    batch = {**on(CUDA, tiny_batch()), "labels": torch.tensor([0, 1, 2], device=CUDA)}
    for _ in range(3):
        optimizer.step(lambda: model(**batch).loss)
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_a_resumed_cuda_run_ends_where_the_uninterrupted_one_does(tmp_path):
    options = dict(priming=2, max_steps=6, batch_size=4, lr=1e-2, progress=False, checkpoint_every=1)

    def run(out, **extra):
        model = tiny_model("bert").to(CUDA)  # dropout on: the CUDA generators' state is checkpointed too
        far.finetune(model, tiny_examples(16), far.FARConfig(0.4), output_dir=out, **options, **extra)
        return far.restore(model).cpu()

    whole = run(tmp_path / "whole")
    cut = tmp_path / "cut"
    run(cut, keep_checkpoints=None)
    # As if killed after step 4's checkpoint: the later ones never written.
    for later in (cut / "checkpoints" / "step-5", cut / "checkpoints" / "step-6"):
        shutil.rmtree(later)
    (cut / "checkpoints" / "latest").write_text("step-4")
    assert read_checkpoint(cut).step == 4
    resumed = run(cut, resume_from=cut, keep_checkpoints=None)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_depth_with_the_kept_bottom_and_grouped_batches_trains_on_cuda_as_on_the_cpu():
    """The frozen bottom run once per example and kept, batches grouped by length: the same seeded run (no dropout)
    on both devices, and the kept states live where the model does."""
    options = dict(
        optimizer="adamw", priming=2, epochs=3, batch_size=4, lr=1e-2, progress=False, seed=3, collate_fn=pad,
        cache_frozen=True, group_by_length=True,
    )  # fmt: skip
    models, kept = {}, {}
    for device in ("cpu", "cuda"):
        model = tiny_model("bert", num_hidden_layers=3, **NO_DROPOUT).to(device)
        config = far.FARConfig(0.4, freeze_embeddings=True, freeze_layers=1)
        kept[device] = far.finetune(model, ragged_examples(16), config, **options).frozen_cache_bytes
        assert all(p.device.type == device for p in model.parameters())
        models[device] = far.restore(model).cpu()
    assert kept["cuda"] == kept["cpu"] > 0
    for (name, a), b in zip(models["cpu"].state_dict().items(), models["cuda"].state_dict().values(), strict=True):
        if not name.endswith("key.bias"):  # softmax ignores a key bias: its gradient is rounding noise
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4, msg=name)


def test_the_automatic_configuration_in_bf16_trains_on_cuda():
    """Retention and depth from priming, precision "auto" (bf16 on a GPU that supports it): the run ends with finite
    weights on the GPU, learners in fp32, and the split model still matches its merged self."""
    model = tiny_model("bert", num_hidden_layers=3).to(CUDA)
    config = far.FARConfig("auto", freeze_embeddings=True, freeze_layers="auto")
    result = far.finetune(
        model, ragged_examples(16), config, priming=2, epochs=2, batch_size=4, lr=1e-3, progress=False,
        collate_fn=pad, cache_frozen=True, group_by_length=True, precision="auto",
    )  # fmt: skip
    assert result.precision["name"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    split = [m for m in model.modules() if isinstance(m, far.SplitLinear)]
    assert split and all(m.learner_weight.dtype == torch.float32 for m in split)
    assert all(torch.isfinite(p).all() and p.device.type == "cuda" for p in model.parameters())
    batch = on(CUDA, tiny_batch())
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits
        far.restore(model)
        torch.testing.assert_close(model(**batch).logits, logits, rtol=1e-5, atol=1e-5)


def test_the_evaluator_scores_a_cuda_model_as_a_cpu_one():
    """Dev examples batched sorted by length on the GPU: the same predictions, back in the split's order."""
    examples = [{"input_ids": e["input_ids"].tolist(), "labels": int(e["labels"])} for e in ragged_examples(40)]
    metric = TextMetric("classification")
    evaluator = LabelEvaluator(examples, pad_lists, label_names=["a", "b", "c"], metric=metric, batch_size=8)
    model = tiny_model("bert")
    on_cpu = evaluator(model)
    cpu_predictions = evaluator.predictions.copy()
    assert evaluator(model.to(CUDA)) == pytest.approx(on_cpu)
    assert (evaluator.predictions == cpu_predictions).all()


def pad_lists(rows: list[dict]) -> dict[str, torch.Tensor]:
    return pad([{"input_ids": torch.tensor(r["input_ids"]), "labels": torch.tensor(r.get("labels", 0))} for r in rows])
