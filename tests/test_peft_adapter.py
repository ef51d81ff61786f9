"""A learners file as a PEFT LoRA adapter: PEFT's own loader gives far.load_learners' logits, merged and swapped."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_batch, tiny_model

import far
from far.methods.peft_adapter import save_peft_adapter

peft = pytest.importorskip("peft")
LABELS = torch.tensor([0, 1, 2])


def user_file(tmp_path, name: str, *, seed: int, freeze_layers: int = 0, ffn_only: bool = False):
    """A tiny BERT reconfigured (random learners), trained a few AdamW steps, saved as a learners file.

    `ffn_only`: only the FFNs' learner rows and columns train (attention, norms and head stay stock).
    """
    model = tiny_model("bert")
    far.reconfigure(model, 0.4, selection="random", seed=seed, freeze_embeddings=True, freeze_layers=freeze_layers)
    for name, param in model.named_parameters():
        param.requires_grad_(param.requires_grad and (not ffn_only or "learner_weight" in name))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for step in range(3):
        model(**tiny_batch(seed=step), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return far.save_learners(model, tmp_path / f"{name}.safetensors")


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**tiny_batch(seed=9)).logits


def far_logits(path) -> torch.Tensor:
    return logits(far.load_learners(tiny_model("bert"), path).eval())


def test_peft_loads_the_adapter_into_the_learners_logits_and_merges_into_the_merged_model(tmp_path):
    path = user_file(tmp_path, "alice", seed=3, freeze_layers=1)
    out = save_peft_adapter(tiny_model("bert"), path, tmp_path / "alice-lora")
    config = json.loads((out / "adapter_config.json").read_text())
    with_learners = far.load_learners(tiny_model("bert"), path)
    ranks = {name.replace("\\", ""): r for name, r in config["rank_pattern"].items()}
    expected = {name: len(nodes) for name, nodes in far.learners(with_learners).items() if len(nodes)}
    for ffn, k in expected.items():  # r is the learner count; the frozen bottom layer has none, and no adapter
        assert ranks[ffn] == k, ffn
    assert config["rank_pattern"] == config["alpha_pattern"]
    assert not any(".layer.0." in name for name in ranks)
    assert any("attention" in name for name in config["modules_to_save"])  # trained whole: saved whole
    assert "classifier" in config["modules_to_save"]

    model = peft.PeftModel.from_pretrained(tiny_model("bert"), out).eval()
    target = far_logits(path)
    assert not torch.allclose(logits(tiny_model("bert").eval()), target, atol=1e-3)  # the user changed something
    torch.testing.assert_close(logits(model), target, rtol=0, atol=1e-5)
    merged = model.merge_and_unload()
    plain = far.restore(far.load_learners(tiny_model("bert"), path)).eval()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[key], value, rtol=0, atol=1e-6, msg=key)


def test_ffn_biases_ride_on_lora_bias_and_two_users_swap(tmp_path):
    alice = user_file(tmp_path, "alice", seed=3)
    bob = user_file(tmp_path, "bob", seed=4)
    base = tiny_model("bert")
    for name, path in (("alice", alice), ("bob", bob)):
        save_peft_adapter(base, path, tmp_path / name)
    assert json.loads((tmp_path / "alice" / "adapter_config.json").read_text())["lora_bias"]
    model = peft.PeftModel.from_pretrained(tiny_model("bert"), tmp_path / "alice", adapter_name="alice")
    model.load_adapter(tmp_path / "bob", adapter_name="bob")
    model.eval()
    for name, path in (("bob", bob), ("alice", alice), ("bob", bob)):
        model.set_adapter(name)
        torch.testing.assert_close(logits(model), far_logits(path), rtol=0, atol=1e-5)


def test_refusals_change_nothing(tmp_path):
    path = user_file(tmp_path, "alice", seed=3)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    base = tiny_model("bert")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    with pytest.raises(ValueError, match="already holds files; name a new folder"):
        save_peft_adapter(base, path, tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="plain stock model"):
        save_peft_adapter(far.reconfigure(tiny_model("bert"), 0.4, selection="random"), path, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    save_peft_adapter(base, path, tmp_path / "new")
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())  # the base is not changed


def test_ffn_only_users_hot_swap_in_place(tmp_path):
    """PEFT's hotswap_adapter replaces LoRA tensors only: adapters without modules_to_save (FFN-only runs)."""
    hotswap = pytest.importorskip("peft.utils.hotswap")
    alice = user_file(tmp_path, "alice", seed=3, ffn_only=True)
    bob = user_file(tmp_path, "bob", seed=4, ffn_only=True)
    for name, path in (("alice", alice), ("bob", bob)):
        save_peft_adapter(tiny_model("bert"), path, tmp_path / name)
        assert json.loads((tmp_path / name / "adapter_config.json").read_text())["modules_to_save"] is None
    model = peft.PeftModel.from_pretrained(tiny_model("bert"), tmp_path / "alice").eval()
    torch.testing.assert_close(logits(model), far_logits(alice), rtol=0, atol=1e-5)
    hotswap.hotswap_adapter(model, str(tmp_path / "bob"), adapter_name="default")
    torch.testing.assert_close(logits(model), far_logits(bob), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_minilm_user_matches_through_peft(minilm_path, tmp_path):
    """The embedded MiniLM, FAR's automatic cut (learners above one frozen layer, embeddings frozen)."""
    from far.models import load_model_and_tokenizer

    def minilm() -> torch.nn.Module:
        return load_model_and_tokenizer("minilm", "classification", num_labels=2)[0].eval()

    model = minilm()
    far.reconfigure(model, 0.39, selection="random", seed=1, freeze_embeddings=True, freeze_layers=1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batch = {"input_ids": torch.randint(1000, 5000, (4, 12), generator=torch.Generator().manual_seed(0))}
    for _ in range(2):
        model(**batch, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    path = far.save_learners(model, tmp_path / "user.safetensors")
    out = save_peft_adapter(minilm(), path, tmp_path / "adapter")
    with torch.no_grad():
        expected = far.load_learners(minilm(), path)(**batch).logits
        got = peft.PeftModel.from_pretrained(minilm(), out)(**batch).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
