"""Learner-only files: exact round trips, size, and refusal of every bad file without side effects."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from conftest import kill_writer_mid_write, tiny_batch, tiny_model
from safetensors.torch import load_file, save_file

import far
from far.saving.digests import content_sha256
from far.saving.fingerprint import base_fingerprint

LABELS = torch.tensor([0, 1, 2])


def trained(arch: str = "bert", *, seed: int = 0, freeze_embeddings: bool = False, steps: int = 2):
    """A tiny model reconfigured at r=0.4 (random learners) and trained a few AdamW steps."""
    model = tiny_model(arch, seed=seed)
    far.reconfigure(model, 0.4, selection="random", seed=3, freeze_embeddings=freeze_embeddings)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        model(**tiny_batch(), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def snapshot(model: torch.nn.Module) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "modules": [(name, type(m)) for name, m in model.named_modules()],
        "grad": [(name, p.requires_grad) for name, p in model.named_parameters()],
        "config": far.get_config(model),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a["modules"] == b["modules"]
    assert a["grad"] == b["grad"]
    assert a["config"] == b["config"]
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**tiny_batch()).logits


def header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8 : 8 + n])


def test_round_trip_onto_a_fresh_base_is_bitwise_exact(arch, tmp_path):
    model = trained(arch)
    path = far.save_learners(model, tmp_path / "learners.safetensors")
    base = tiny_model(arch)
    assert not torch.equal(logits(base), logits(model))  # training changed something
    assert far.load_learners(base, path) is base
    assert_same(snapshot(base), snapshot(model))
    assert torch.equal(logits(base), logits(model))


def test_load_onto_a_model_reconfigured_the_same_way(tmp_path):
    model = trained()
    path = far.save_learners(model, tmp_path / "l.safetensors")
    base = far.reconfigure(tiny_model(), 0.4, selection="random", seed=3)
    far.load_learners(base, path)
    assert_same(snapshot(base), snapshot(model))


def test_frozen_embeddings_stay_out_of_the_file_and_round_trip(tmp_path):
    model = trained(freeze_embeddings=True)
    path = far.save_learners(model, tmp_path / "l.safetensors")
    assert not any(key.endswith("_embeddings.weight") for key in load_file(path))
    base = tiny_model()
    far.load_learners(base, path)
    assert_same(snapshot(base), snapshot(model))
    assert not base.bert.embeddings.word_embeddings.weight.requires_grad


def test_file_holds_exactly_the_trainable_tensors_and_little_else(tmp_path):
    model = trained()
    path = far.save_learners(model, tmp_path / "l.safetensors")
    tensors = load_file(path)
    n_learners = sum(t.numel() for k, t in tensors.items() if k.endswith(".learner_indices"))
    trainable = far.summary(model, verbose=False).trainable_parameters
    data = sum(t.numel() * t.element_size() for t in tensors.values())
    assert data == 4 * trainable + 8 * n_learners  # fp32 trainables + int64 node indices, nothing frozen
    header_len, entries = header(path)
    assert path.stat().st_size == 8 + header_len + data  # no hidden payload
    assert path.stat().st_size <= 1.01 * data + 8 * 1024
    meta = entries["__metadata__"]
    assert meta["model_type"] == "bert" and meta["selection"] == "random" and float(meta["retention"]) == 0.4
    assert meta["format_version"] == "2" and len(meta["base_fingerprint"]) == 64
    full_checkpoint = sum(p.numel() for p in tiny_model().parameters()) * 4
    assert path.stat().st_size < full_checkpoint


def test_fingerprint_is_the_same_on_the_plain_base_and_the_reconfigured_model():
    model = trained()
    ffns, chosen = far.find_ffns(model), far.learners(model)
    stored = [n for n, p in model.named_parameters() if p.requires_grad and "learner" not in n]
    base = tiny_model()
    assert base_fingerprint(model, ffns, chosen, stored) == base_fingerprint(base, ffns, chosen, stored)
    other = tiny_model(seed=1)
    assert base_fingerprint(other, ffns, chosen, stored) != base_fingerprint(base, ffns, chosen, stored)


def test_base_may_differ_only_where_the_file_overwrites(tmp_path):
    model = trained()
    path = far.save_learners(model, tmp_path / "l.safetensors")
    learner = int(far.learners(model)["bert.encoder.layer.0.output.dense"][0])
    base = tiny_model()
    with torch.no_grad():  # values the file replaces: a learner row and a trained head
        base.bert.encoder.layer[0].intermediate.dense.weight[learner] += 1.0
        base.classifier.weight.mul_(2.0)
    far.load_learners(base, path)
    assert_same(snapshot(base), snapshot(model))


def refused(model: torch.nn.Module, path: Path, match: str) -> None:
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        far.load_learners(model, path)
    assert_same(snapshot(model), before)


def test_one_flipped_byte_in_a_tensor_is_refused(tmp_path):
    path = far.save_learners(trained(), tmp_path / "l.safetensors")
    header_len, entries = header(path)
    start, end = entries["bert.encoder.layer.1.output.dense.learner_weight"]["data_offsets"]
    raw = bytearray(path.read_bytes())
    raw[8 + header_len + (start + end) // 2] ^= 0x01  # one low mantissa bit
    path.write_bytes(bytes(raw))
    refused(tiny_model(), path, "corrupted: its contents do not match the sha256")


def test_truncated_file_is_refused(tmp_path):
    path = far.save_learners(trained(), tmp_path / "l.safetensors")
    path.write_bytes(path.read_bytes()[:-100])
    refused(tiny_model(), path, "not a readable safetensors file \\(truncated or corrupted")


def test_a_pickle_is_never_unpickled(tmp_path):
    path = tmp_path / "l.safetensors"
    torch.save({"x": torch.ones(3)}, path)
    refused(tiny_model(), path, "not a readable safetensors file")


def test_file_from_a_different_base_model_is_refused(tmp_path):
    model = trained()
    path = far.save_learners(model, tmp_path / "l.safetensors")
    refused(tiny_model(seed=1), path, "trained from a different base model")
    learners = set(far.learners(model)["bert.encoder.layer.0.output.dense"].tolist())
    frozen_node = min(set(range(40)) - learners)
    base = tiny_model()
    with torch.no_grad():  # a single frozen FFN value off already makes another base
        base.bert.encoder.layer[0].output.dense.weight[5, frozen_node] += 1e-3
    refused(base, path, "different base model")


def test_file_for_another_architecture_is_refused(tmp_path):
    path = far.save_learners(trained("gpt2"), tmp_path / "l.safetensors")
    refused(tiny_model("bert"), path, "saved from a 'gpt2' model, this model is 'bert'")


def test_shapes_that_disagree_are_refused(tmp_path):
    path = far.save_learners(trained(), tmp_path / "l.safetensors")
    refused(tiny_model(num_labels=2), path, r"classifier.bias is \(3,\) torch.float32, the model needs \(2,\)")


def test_model_reconfigured_differently_is_refused(tmp_path):
    path = far.save_learners(trained(), tmp_path / "l.safetensors")
    other = far.reconfigure(tiny_model(), 0.4, selection="random", seed=4)
    refused(other, path, "reconfigured differently")


def rewrite(path: Path, change) -> None:
    tensors, (_, entries) = load_file(path), header(path)
    metadata = change(dict(entries["__metadata__"]))
    save_file(tensors, path, metadata=metadata)


def test_missing_or_unknown_metadata_is_refused(tmp_path):
    path = far.save_learners(trained(), tmp_path / "l.safetensors")
    save_file(load_file(path), tmp_path / "bare.safetensors")
    refused(tiny_model(), tmp_path / "bare.safetensors", "has no FAR learners metadata")

    rewrite(path, lambda m: {**m, "format_version": "3"})
    refused(tiny_model(), path, "format version .3., this version of far reads versions 1 and 2")

    path = far.save_learners(trained(), tmp_path / "l.safetensors")

    def drop_fingerprint(meta: dict) -> dict:
        del meta["base_fingerprint"]
        return {**meta, "content_sha256": content_sha256(meta, load_file(path))}

    rewrite(path, drop_fingerprint)
    refused(tiny_model(), path, r"lacks the metadata \['base_fingerprint'\]")


def test_save_needs_a_reconfigured_model(tmp_path):
    with pytest.raises(ValueError, match="not reconfigured by FAR; call far.reconfigure"):
        far.save_learners(tiny_model(), tmp_path / "l.safetensors")
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.load_learners("model", tmp_path / "l.safetensors")
    with pytest.raises(FileNotFoundError, match="no learners file"):
        far.load_learners(tiny_model(), tmp_path / "missing.safetensors")


def test_minilm_learners_file_size(minilm_path, tmp_path):
    from transformers import AutoModel

    model = far.reconfigure(AutoModel.from_pretrained(minilm_path), 0.4, selection="random")
    path = far.save_learners(model, tmp_path / "l.safetensors")
    data = sum(t.numel() * t.element_size() for t in load_file(path).values())
    assert path.stat().st_size <= 1.01 * data + 32 * 1024
    base = AutoModel.from_pretrained(minilm_path)
    far.load_learners(base, path)
    assert far.learners(base).keys() == far.learners(model).keys()


# Run in a child process: writes a newer learners file, but dies halfway through writing it.
_KILLED_WRITER = """
import sys, time
import far
from far.saving import learners_file
from safetensors.torch import save
from conftest import tiny_model

def half_then_hang(tensors, path, metadata=None):
    data = save(tensors, metadata=metadata)
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
    print("half written", flush=True)
    time.sleep(120)

learners_file.save_file = half_then_hang
model = far.reconfigure(tiny_model(seed=5), 0.4, selection="random", seed=9)
far.save_learners(model, sys.argv[1])
"""


@pytest.mark.slow
def test_killed_mid_write_leaves_the_previous_file_intact(tmp_path):
    model = trained()
    path = far.save_learners(model, tmp_path / "l.safetensors")
    previous = path.read_bytes()
    kill_writer_mid_write(_KILLED_WRITER, path)
    assert path.read_bytes() == previous
    assert list(tmp_path.glob(".l.safetensors.tmp-*"))  # the half-written temp file, never renamed
    base = tiny_model()
    far.load_learners(base, path)
    assert torch.equal(logits(base), logits(model))
