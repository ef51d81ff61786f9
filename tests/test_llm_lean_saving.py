"""A lean fine-tune saved as its learners file, and put back on the base GGUF model as it was trained."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file
from test_llm_lean import right_padded, tiny_hf, write_gguf

from far.config import FARConfig
from far.llm.gguf_file import load_lean_model
from far.llm.lean_far import prime_and_split, set_trainable
from far.llm.lean_learners import load_learners, values_dtype
from far.llm.lean_saving import load_trained, round_trained, save_trained
from far.llm.zo import CompactMeZO

LABELS = torch.tensor([5, 11])


def loss_fn(model, batch):
    logits = model.label_logits(batch["input_ids"], batch["attention_mask"], LABELS)
    return torch.nn.functional.cross_entropy(logits, batch["labels"])


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("lean") / "llama.gguf"
    write_gguf(tiny_hf("llama"), path)
    return path


def trained_model(gguf, method: str, dtype: torch.dtype):
    ids, mask = right_padded()
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}
    model = load_lean_model(gguf)
    if method == "far":
        prime_and_split(model, [batch], loss_fn, FARConfig(0.25, seed=0), dtype)
    else:
        set_trainable(model, {"full": "all"}[method], dtype)
    optimizer = CompactMeZO(model, 1e-2, 1e-3, seed=0)
    for _ in range(3):
        optimizer.step(lambda: loss_fn(model, batch))
    return model


@pytest.mark.parametrize(
    ("method", "dtype"), [("far", torch.float32), ("far", torch.bfloat16), ("full", torch.float32)]
)
def test_the_trained_file_restores_the_fine_tuned_model(gguf, tmp_path, method, dtype):
    model = trained_model(gguf, method, dtype)
    ids, mask = right_padded()
    size = save_trained(model, tmp_path / "trained.safetensors", base=gguf)
    assert size == (tmp_path / "trained.safetensors").stat().st_size
    assert not list(tmp_path.glob(".*tmp*"))  # written under a temporary name, then renamed
    reloaded = load_trained(load_lean_model(gguf), tmp_path / "trained.safetensors", base=gguf)
    with torch.no_grad():
        assert torch.equal(reloaded.label_logits(ids, mask, LABELS), model.label_logits(ids, mask, LABELS))
    trained = {n: w.stored for n, w in model.named_modules() if getattr(w, "trainable", False)}
    again = {n: w.stored for n, w in reloaded.named_modules() if getattr(w, "trainable", False)}
    assert trained.keys() == again.keys()  # the same weights trainable: MeZO can go on from here
    assert all(torch.equal(trained[n], again[n]) and trained[n].dtype == again[n].dtype for n in trained)
    differs = load_lean_model(gguf)
    with torch.no_grad():
        assert not torch.equal(differs.label_logits(ids, mask, LABELS), model.label_logits(ids, mask, LABELS))


def test_fp32_training_shipped_in_bf16_scores_on_the_stock_model_as_the_rounded_model(gguf, tmp_path):
    model = trained_model(gguf, "far", torch.float32)
    ids, mask = right_padded()
    save_trained(model, tmp_path / "fp32.safetensors", base=gguf)
    round_trained(model, torch.bfloat16)  # the model now holds what the file keeps
    assert all(torch.equal(w.stored, w.stored.bfloat16().float()) for w in model.trainable_weights())
    assert all(w.stored.dtype == torch.float32 for w in model.trainable_weights())
    size = save_trained(model, tmp_path / "bf16.safetensors", base=gguf, values_dtype=torch.bfloat16)
    assert size < (tmp_path / "fp32.safetensors").stat().st_size
    assert values_dtype(tmp_path / "bf16.safetensors") == torch.bfloat16  # a base loaded in bf16 applies it
    stock = load_learners(load_lean_model(gguf), tmp_path / "bf16.safetensors")  # bf16 base, as far generate
    with torch.no_grad():  # the same weights; the split model sums its FFN nodes in another order (fp32 rounding)
        torch.testing.assert_close(
            stock.label_logits(ids, mask, LABELS), model.label_logits(ids, mask, LABELS), rtol=1e-5, atol=1e-6
        )


def test_the_file_holds_only_trained_weights_and_the_learners(gguf, tmp_path):
    model = trained_model(gguf, "far", torch.bfloat16)
    save_trained(model, tmp_path / "t.safetensors", base=gguf)
    raw = (tmp_path / "t.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    metadata = header.pop("__metadata__")
    assert metadata["base_file"] == "llama.gguf" and metadata["format"] == "far.lean-learners"
    assert {k for k in header if k.endswith(".learner_indices")} == {
        f"layers.{i}.mlp.down_proj.learner_indices" for i in range(2)
    }
    assert not any(".parts." in k for k in header)  # learner rows only, never the frozen nodes
    values = json.loads(metadata["values"])
    ffn = {f"layers.{i}.mlp.{p}_proj.learner_weight" for i in range(2) for p in ("gate", "up", "down")}
    attention = {f"layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"}
    norms = {f"layers.{i}.{n}.weight" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")}
    assert set(values) == ffn | attention | norms | {"norm.weight"}
    assert {values[k]["dtype"] for k in ffn | attention} == {"bfloat16"}
    up = "layers.0.mlp.up_proj.learner_weight"
    stored = header[up + ".delta" if values[up]["encoding"] == "delta8" else up]
    assert stored["shape"] == [10, 32]


def test_a_file_is_refused_before_anything_changes(gguf, tmp_path):
    model = trained_model(gguf, "far", torch.float32)
    save_trained(model, tmp_path / "t.safetensors", base=gguf)
    other = tmp_path / "other.gguf"
    other.write_bytes(gguf.read_bytes() + b"\0" * 32)
    fresh = load_lean_model(gguf)
    before = {n: p.clone() for n, p in fresh.named_parameters()}
    with pytest.raises(ValueError, match="was not read from"):
        load_trained(fresh, tmp_path / "t.safetensors", base=other)
    with pytest.raises(ValueError, match="was trained from llama.gguf"):
        load_trained(load_lean_model(other), tmp_path / "t.safetensors", base=other)
    with pytest.raises(ValueError, match="split for training"):
        load_trained(model, tmp_path / "t.safetensors", base=gguf)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not a learners file of a GGUF causal LM"):
        load_trained(fresh, tmp_path / "plain.safetensors", base=gguf)
    assert all(torch.equal(p, before[n]) for n, p in fresh.named_parameters())
    assert all(len(layer.mlp.down_proj.parts) == 1 for layer in fresh.layers)
    with pytest.raises(ValueError, match="nothing in this model is trainable"):
        save_trained(fresh, tmp_path / "none.safetensors", base=gguf)
    assert not (tmp_path / "none.safetensors").exists()
