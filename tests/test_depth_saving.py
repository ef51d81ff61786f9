"""freeze_layers survives every way a FAR layout is saved and rebuilt: learners files, checkpoints, folders."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model
from safetensors.torch import load_file
from test_learners_file import assert_same, snapshot

import far
from far.saving.layout import inferred_config
from far.surgery import learners_from_state_dict, reconfigure_with_learners
from far.training.checkpoint import load_model_state, read_checkpoint, save_checkpoint

LABELS = torch.tensor([0, 1, 2])
DEPTH_ARCHS = ["bert", "llama"]


def trained(arch: str, freeze_layers: int | str = 2, seed: int = 0) -> torch.nn.Module:
    """A 4-layer tiny model reconfigured with freeze_layers and trained two AdamW steps."""
    model = tiny_model(arch, seed=seed, num_hidden_layers=4).train()
    generator = torch.Generator().manual_seed(5)
    scores = {name: torch.rand(f.n_nodes, generator=generator) for name, f in far.find_ffns(model).items()}
    far.reconfigure(model, 0.4, scores=scores, freeze_layers=freeze_layers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(**tiny_batch(), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def base(arch: str) -> torch.nn.Module:
    return tiny_model(arch, num_hidden_layers=4)


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(**tiny_batch()).logits


def same_depth(a, b) -> None:
    assert a.far_state.frozen_layers == b.far_state.frozen_layers
    assert a.far_state.frozen_parameters == b.far_state.frozen_parameters
    assert a.far_state.frozen_embeddings == b.far_state.frozen_embeddings


@pytest.mark.parametrize("arch", DEPTH_ARCHS)
@pytest.mark.parametrize("freeze_layers", [2, "auto"])
def test_learners_file_round_trip_rebuilds_the_frozen_layers(arch, freeze_layers, tmp_path):
    model = trained(arch, freeze_layers)
    path = far.save_learners(model, tmp_path / "l.safetensors")
    tensors = load_file(path)
    frozen = far.find_ffns(model)
    bottom = list(frozen)[: model.far_state.frozen_layers]
    assert all(tensors[f"{name}.learner_indices"].numel() == 0 for name in bottom)
    assert not any("embed" in key for key in tensors)  # frozen: left to the base
    loaded = far.load_learners(base(arch), path)
    assert_same(snapshot(loaded), snapshot(model))
    same_depth(loaded, model)
    assert torch.equal(logits(loaded), logits(model))


def test_learners_file_refuses_a_base_whose_frozen_layer_differs(tmp_path):
    path = far.save_learners(trained("bert"), tmp_path / "l.safetensors")
    other = base("bert")
    with torch.no_grad():
        other.bert.encoder.layer[0].attention.self.query.weight[0, 0] += 1e-3  # frozen: part of the base
    with pytest.raises(ValueError, match="trained from a different base model"):
        far.load_learners(other, path)
    assert not far.is_reconfigured(other)


@pytest.mark.parametrize("arch", DEPTH_ARCHS)
def test_checkpoint_round_trip(arch, tmp_path):
    model = trained(arch)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    save_checkpoint(tmp_path, 3, model, optimizer, scheduler, {"plan": {}})
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint.far_config == far.get_config(model) and checkpoint.far_config.freeze_layers == 2
    plain = tiny_model(arch, seed=7, num_hidden_layers=4)
    load_model_state(plain, checkpoint)
    assert_same(snapshot(plain), snapshot(model))
    same_depth(plain, model)
    assert torch.equal(logits(plain), logits(model))


@pytest.mark.parametrize("freeze_layers", [1, "auto"])
def test_reconfigure_with_learners_rebuilds_layout_and_freezing(freeze_layers):
    model = trained("llama", freeze_layers)
    fresh = tiny_model("llama", seed=3, num_hidden_layers=4)
    reconfigure_with_learners(fresh, learners_from_state_dict(fresh, model.state_dict()), far.get_config(model))
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert_same(snapshot(fresh), snapshot(model))
    same_depth(fresh, model)


def test_reconfigure_with_learners_that_disagree_with_the_config_is_refused():
    model = trained("bert", 2)
    chosen = far.learners(model)
    fresh = base("bert")
    with pytest.raises(ValueError, match="leave the bottom 2 layers empty, but the config says freeze_layers=1"):
        reconfigure_with_learners(fresh, chosen, far.FARConfig(0.4, freeze_layers=1))
    with pytest.raises(ValueError, match="non-empty"):  # without freeze_layers, empty learners are wrong
        reconfigure_with_learners(fresh, chosen, far.FARConfig(0.4))
    holes = dict(chosen, **{"bert.encoder.layer.3.output.dense": torch.empty(0, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"exactly the bottom frozen layers empty .* empty layers \[0, 1, 3\]"):
        reconfigure_with_learners(fresh, holes, far.FARConfig(0.4, freeze_layers="auto"))
    assert not far.is_reconfigured(fresh)


def test_save_pretrained_round_trip(tmp_path):
    model = trained("bert")
    far.save_pretrained(model, tmp_path / "ckpt")
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert_same(snapshot(loaded), snapshot(model))
    same_depth(loaded, model)


def test_a_layout_saved_without_its_config_infers_the_frozen_layers():
    model = trained("bert", 2)
    config = inferred_config(base("bert"), far.learners(model))
    assert config.freeze_layers == 2 and config.retention == 0.4 and config.selection == "per_layer"
