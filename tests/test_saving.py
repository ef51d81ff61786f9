"""FAR checkpoints: reload with the layout, merge to a plain checkpoint, refuse inconsistent folders."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_CONFIGS, kill_writer_mid_write, tiny_batch, tiny_model
from test_learners_file import assert_same, logits, snapshot, trained
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

import far

# One of each FFN kind (the learners-file tests cover every architecture): BERT-style Linear,
# other module names, GPT-2's Conv1D, a gated MLP.
SOME_ARCHITECTURES = ["bert", "distilbert", "gpt2", "llama"]


@pytest.mark.parametrize("arch", SOME_ARCHITECTURES)
def test_far_checkpoint_reloads_with_its_layout(arch, tmp_path):
    model = trained(arch)
    assert far.save_pretrained(model, tmp_path / "ckpt") == tmp_path / "ckpt"
    entry = json.loads((tmp_path / "ckpt" / "config.json").read_text())["far"]
    assert entry == {"format_version": 2, "config": far.get_config(model).to_dict()}
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert type(loaded) is type(model) and not loaded.training
    assert_same(snapshot(loaded), snapshot(model))
    assert torch.equal(logits(loaded), logits(model))
    assert not hasattr(loaded.config, "far")  # a later save of the restored model must not carry it


def test_frozen_embeddings_are_frozen_again_after_reload(tmp_path):
    model = trained(freeze_embeddings=True)
    far.save_pretrained(model, tmp_path / "ckpt")
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert_same(snapshot(loaded), snapshot(model))
    assert not loaded.bert.embeddings.word_embeddings.weight.requires_grad


@pytest.mark.parametrize("arch", SOME_ARCHITECTURES)
def test_restored_model_is_an_ordinary_checkpoint(arch, tmp_path):
    model = trained(arch)
    split = logits(model)
    expected = logits(far.restore(model))
    # Only the order of the sums over FFN nodes differs from the split layers: fp32 rounding.
    torch.testing.assert_close(expected, split, rtol=0, atol=1e-6)
    model.save_pretrained(tmp_path / "plain")
    assert "far" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "plain").eval()
    assert torch.equal(logits(loaded), expected)
    state, merged = loaded.state_dict(), model.state_dict()
    assert state.keys() == merged.keys() and all(torch.equal(state[k], merged[k]) for k in state)
    again = far.from_pretrained(tmp_path / "plain")  # a plain folder is just the Hugging Face load
    assert not far.is_reconfigured(again) and torch.equal(logits(again), expected)


def test_far_save_pretrained_of_a_plain_model_drops_a_stale_far_entry(tmp_path):
    model = tiny_model()
    model.config.far = {"format_version": 1, "config": {}}  # e.g. from AutoConfig of a FAR folder
    far.save_pretrained(model, tmp_path / "plain")
    assert "far" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    loaded = far.from_pretrained(tmp_path / "plain", model_class=AutoModelForSequenceClassification)
    assert torch.equal(logits(loaded), logits(model))


def test_models_own_save_pretrained_reloads_with_its_layout(tmp_path):
    model = trained()
    model.save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="no 'far' entry in config.json .* retention=0.4 inferred"):
        loaded = far.from_pretrained(tmp_path / "hf")
    assert far.learners(loaded).keys() == far.learners(model).keys()
    for name, idx in far.learners(model).items():
        assert torch.equal(far.learners(loaded)[name], idx)
    state, expected = loaded.state_dict(), model.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
    assert far.get_config(loaded).retention == 0.4


def test_tied_lm_head_round_trips(tmp_path):
    config = AutoConfig.for_model("llama", tie_word_embeddings=True, **TINY_CONFIGS["llama"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    far.reconfigure(model, 0.4, selection="random")
    far.save_pretrained(model, tmp_path / "ckpt")
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(loaded(**tiny_batch()).logits, model(**tiny_batch()).logits)
    # the learners file of a tied model overwrites the embedding under both names
    path = far.save_learners(model, tmp_path / "l.safetensors")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config).eval()
    far.load_learners(base, path)
    assert_same(snapshot(base), snapshot(model))


def test_inconsistent_or_foreign_folders_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        far.from_pretrained(tmp_path / "nothing")
    far.save_pretrained(trained(), tmp_path / "ckpt")
    config_path = tmp_path / "ckpt" / "config.json"
    data = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**data, "far": {"format_version": 7, "config": {}}}))
    with pytest.raises(ValueError, match="format version 7, this version of far reads version 2; upgrade far"):
        far.from_pretrained(tmp_path / "ckpt")
    config_path.write_text(json.dumps({**data, "far": {"format_version": 1, "config": {}}}))
    with pytest.raises(ValueError, match="written by an older far: merge it there"):
        far.from_pretrained(tmp_path / "ckpt")
    config_path.write_text(json.dumps({**data, "far": {"format_version": 2, "config": {"retention": 3}}}))
    with pytest.raises(ValueError, match="'far' entry is invalid"):
        far.from_pretrained(tmp_path / "ckpt")

    tiny_model().save_pretrained(tmp_path / "plain")
    config_path = tmp_path / "plain" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "far": data["far"]}))
    with pytest.raises(ValueError, match="has a 'far' entry but its weights hold no FAR layout"):
        far.from_pretrained(tmp_path / "plain")


def test_save_pretrained_checks_its_input(tmp_path):
    with pytest.raises(TypeError, match="needs a transformers PreTrainedModel"):
        far.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
    with pytest.raises(ValueError, match="does not push to the Hub"):
        far.save_pretrained(tiny_model(), tmp_path / "x", push_to_hub=True)
    model = trained()
    del model.far_state
    with pytest.raises(ValueError, match="no FAR config"):
        far.save_pretrained(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


# Run in a child process: starts replacing the checkpoint folder, but dies halfway through.
_KILLED_WRITER = """
import sys, time
import far
from far.saving import pretrained
from conftest import tiny_model

real = pretrained.write_pretrained

def half_then_hang(model, folder, **kwargs):
    real(model, folder, **kwargs)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    print("half written", flush=True)
    time.sleep(120)

pretrained.write_pretrained = half_then_hang
far.save_pretrained(far.reconfigure(tiny_model(seed=5), 0.4, selection="random"), sys.argv[1])
"""


@pytest.mark.slow
def test_killed_mid_write_leaves_the_previous_checkpoint_intact(tmp_path):
    model = trained()
    far.save_pretrained(model, tmp_path / "ckpt")
    kill_writer_mid_write(_KILLED_WRITER, tmp_path / "ckpt")
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert_same(snapshot(loaded), snapshot(model))
