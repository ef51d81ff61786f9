"""A GGUF causal LM's learners file as a PEFT adapter: on the transformers base far writes, PEFT's own loader gives
the lean runtime's logits with the file (fp32 compute on both sides), for Llama and Gemma-3; what is refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_model
from test_llm_lean import right_padded, tiny_hf, write_gguf
from test_llm_learners_file import train_user

import far
from far.cli.main import main
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import LeanLearnersFileError
from far.llm.lean_saving import save_trained
from far.methods.lean_hf import hf_model, hf_state_dict, read_base_record, save_hf_base
from far.methods.peft_lean import save_lean_peft_adapter, user_hf_model

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def user(request, tmp_path_factory):
    """A tiny GGUF model and a user's learners file for it (MeZO + FAR with depth: layer 0 frozen, bf16 values)."""
    folder = tmp_path_factory.mktemp(request.param)
    gguf = folder / f"{request.param}.gguf"
    write_gguf(tiny_hf(request.param), gguf)
    save_trained(train_user(gguf, 0, lr=0.05), folder / "alice.safetensors", base=gguf)  # large steps: a visible change
    return gguf, folder / "alice.safetensors"


@torch.no_grad()
def hf_logits(model) -> torch.Tensor:
    return model(right_padded()[0]).logits


@torch.no_grad()
def lean_logits(gguf, learners=None, dtype=torch.bfloat16) -> torch.Tensor:
    model = load_lean_model(gguf, dtype)
    return (model if learners is None else far.load_learners(model, learners)).logits(right_padded()[0])


def test_peft_on_the_written_base_gives_the_lean_models_logits_and_merges_into_its_weights(user, tmp_path):
    gguf, alice = user
    model = load_lean_model(gguf)
    stock = {k: v.clone() for k, v in hf_state_dict(model).items()}
    save_hf_base(model, tmp_path / "base")
    out = save_lean_peft_adapter(model, alice, tmp_path / "alice-lora", base_dir=tmp_path / "base")
    assert all(torch.equal(v, stock[k]) for k, v in hf_state_dict(model).items())  # the stock model, as it was

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # fp32, as written
    assert base.dtype == torch.float32
    torch.testing.assert_close(hf_logits(base), lean_logits(gguf), rtol=0, atol=1e-5)  # the base is the lean model's
    target = lean_logits(gguf, alice)
    assert not torch.allclose(hf_logits(base), target, atol=1e-2)  # the user changed something
    with_adapter = peft.PeftModel.from_pretrained(base, out).eval()
    torch.testing.assert_close(hf_logits(with_adapter), target, rtol=0, atol=1e-5)

    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    assert read_base_record(out) == read_base_record(tmp_path / "base")
    ranks = {name.replace("\\", ""): r for name, r in config["rank_pattern"].items()}
    with_learners = far.load_learners(load_lean_model(gguf), alice)
    for slot, _ in with_learners.far_learners.base:  # r is each projection's learner count
        if slot.nodes is not None:
            assert ranks[f"model.{slot.key.removesuffix('.learner_weight')}"] == len(slot.nodes)
    assert config["rank_pattern"] == config["alpha_pattern"]
    assert not any(".layers.0." in name for name in ranks)  # the frozen bottom layer: no adapter
    assert "model.norm" in config["modules_to_save"]  # an RMSNorm trained whole: saved whole, by its module name
    assert "model.layers.1.self_attn.q_proj" in config["modules_to_save"]

    merged = with_adapter.merge_and_unload().state_dict()
    for key, value in hf_state_dict(with_learners).items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6, msg=key)


def test_in_float64_the_unmerged_adapter_is_the_users_model_exactly(user, tmp_path):
    """The adapter represents the user exactly: in float64, PEFT's unmerged x W^T + (x A^T) B^T gives the logits of
    the user's merged weights; what the two paths differ by in fp32 is fp32's rounding (experiments/lean_peft_adapter.py
    measures it on SmolLM2-135M)."""
    gguf, alice = user
    if gguf.stem == "gemma3":
        pytest.skip("transformers' Gemma-3 RMSNorm computes in float32 even in a float64 model: no float64 reference")
    model = load_lean_model(gguf)
    out = save_lean_peft_adapter(model, alice, tmp_path / "alice-lora")
    base = hf_model(model.config, hf_state_dict(model)).double()  # what save_hf_base writes, in float64
    exact = hf_logits(user_hf_model(model, alice).double())
    assert not torch.allclose(hf_logits(base), exact, atol=1e-2)  # the user changed something
    unmerged = peft.PeftModel.from_pretrained(base, out).eval()
    assert {p.dtype for p in unmerged.parameters()} == {torch.float64}  # the LoRA factors too
    torch.testing.assert_close(hf_logits(unmerged), exact, rtol=0, atol=1e-9)


def test_a_first_order_users_float32_file_is_exact_on_the_float32_base(user, tmp_path):
    gguf, _ = user
    save_trained(train_user(gguf, 2, torch.float32, lr=0.05), tmp_path / "carol.safetensors", base=gguf)
    model = load_lean_model(gguf, torch.float32)
    save_hf_base(model, tmp_path / "base32")
    assert read_base_record(tmp_path / "base32")["storage_dtype"] == "float32"
    out = save_lean_peft_adapter(model, tmp_path / "carol.safetensors", tmp_path / "carol-lora")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base32")
    got = hf_logits(peft.PeftModel.from_pretrained(base, out).eval())
    torch.testing.assert_close(got, lean_logits(gguf, tmp_path / "carol.safetensors", torch.float32), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="holds the base of .* in float32, not this model's .* in bfloat16"):
        save_lean_peft_adapter(load_lean_model(gguf), user[1], tmp_path / "new", base_dir=tmp_path / "base32")
    assert not (tmp_path / "new").exists()


def test_a_file_for_another_base_and_other_bad_inputs_are_refused_before_anything_is_written(user, tmp_path):
    gguf, alice = user
    other = tmp_path / "other.gguf"
    write_gguf(tiny_hf("llama", seed=1), other)
    with pytest.raises(LeanLearnersFileError, match="was trained from .* not from this model's other.gguf"):
        save_lean_peft_adapter(load_lean_model(other), alice, tmp_path / "lora")
    assert not (tmp_path / "lora").exists()
    encoder_file = tmp_path / "encoder.safetensors"
    far.save_learners(far.reconfigure(tiny_model("bert"), 0.4, selection="random"), encoder_file)
    with pytest.raises(LeanLearnersFileError, match="is an encoder's learners file"):
        save_lean_peft_adapter(load_lean_model(gguf), encoder_file, tmp_path / "lora")
    holding = far.load_learners(load_lean_model(gguf), alice)
    with pytest.raises(ValueError, match="holds a learners file; pass the stock model"):
        save_lean_peft_adapter(holding, alice, tmp_path / "lora")
    with pytest.raises(ValueError, match="holds a learners file; pass the stock model"):
        save_hf_base(holding, tmp_path / "base")
    assert not (tmp_path / "base").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds files; name a new folder"):
        save_lean_peft_adapter(load_lean_model(gguf), alice, tmp_path / "taken")
    with pytest.raises(ValueError, match="holds no far_base.json"):
        save_lean_peft_adapter(load_lean_model(gguf), alice, tmp_path / "lora", base_dir=tmp_path / "taken")
    assert not (tmp_path / "lora").exists() and (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_far_export_model_peft_writes_the_adapter_and_the_base_once(user, tmp_path, capsys):
    gguf, alice = user
    args = ["export", "--model", str(gguf), "--learners", str(alice)]
    base = tmp_path / "base"
    assert main([*args, "--peft", str(tmp_path / "a"), "--base-out", str(base)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote the transformers base to {base}" in printed and "wrote a PEFT LoRA adapter" in printed
    assert main([*args, "--peft", str(tmp_path / "b"), "--base-out", str(base)]) == 0
    assert "holds this model's weights: used as it is" in capsys.readouterr().out
    model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), tmp_path / "b")
    torch.testing.assert_close(hf_logits(model.eval()), lean_logits(gguf, alice), rtol=0, atol=1e-5)

    other = tmp_path / "other.gguf"
    write_gguf(tiny_hf("llama", seed=1), other)
    refused = ["export", "--model", str(other), "--learners", str(alice), "--peft", str(tmp_path / "c")]
    assert main([*refused, "--base-out", str(tmp_path / "base2")]) == 2
    assert "was trained from" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not (tmp_path / "base2").exists()
    assert main([*args[:3], "--peft", str(tmp_path / "c")]) == 2
    assert "add --learners FILE" in capsys.readouterr().err
    assert main(["export", "--checkpoint", "minilm", "--learners", str(alice), "--peft", "x", "--base-out", "y"]) == 2
    assert "--base-out writes a GGUF causal LM's transformers base" in capsys.readouterr().err
