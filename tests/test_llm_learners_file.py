"""A learners file per user for a GGUF causal LM: round trip, A -> B -> A bit for bit, and what is refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import save_file
from test_llm_lean import right_padded, tiny_hf, write_gguf

import far
from far.config import FARConfig
from far.llm.gguf_file import load_lean_model
from far.llm.lean_config import from_hf_config
from far.llm.lean_far import prime_and_split
from far.llm.lean_learners import DELTA8, RAW, LeanLearnersFileError, decode, encode
from far.llm.lean_model import from_state_dict
from far.llm.lean_saving import save_trained
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


def train_user(gguf, seed: int, dtype: torch.dtype = torch.bfloat16, lr: float = 1e-4):
    """MeZO + FAR with depth (the bottom layer frozen whole) on the tiny GGUF model, a user per seed."""
    ids, mask = right_padded()
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([seed % 2, 1, 0])}
    model = load_lean_model(gguf)
    prime_and_split(model, [batch], loss_fn, FARConfig(0.3, selection="random", seed=seed, freeze_layers=1), dtype)
    optimizer = CompactMeZO(model, lr, 1e-3, seed=seed)
    for _ in range(4):
        optimizer.step(lambda: loss_fn(model, batch))
    return model


@pytest.fixture(scope="module")
def users(gguf, tmp_path_factory):
    folder = tmp_path_factory.mktemp("users")
    trained = {name: train_user(gguf, seed) for name, seed in (("alice", 0), ("bob", 1))}
    for name, model in trained.items():
        save_trained(model, folder / f"{name}.safetensors", base=gguf)
    return trained, {name: folder / f"{name}.safetensors" for name in trained}


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same(model, expected: dict[str, torch.Tensor]) -> None:
    now = dict(model.named_parameters())
    assert now.keys() == expected.keys()
    for name, value in expected.items():
        assert now[name].dtype == value.dtype and torch.equal(now[name], value), name


def test_a_users_file_puts_the_trained_weights_on_the_stock_model(gguf, users):
    trained, files = users
    model = far.load_learners(load_lean_model(gguf), files["alice"])
    stock = load_lean_model(gguf)
    alice = trained["alice"]
    assert alice.layers[0].mlp.learner_nodes.numel() == 0  # the bottom layer is frozen whole
    for layer, trained_layer, stock_layer in zip(model.layers, alice.layers, stock.layers, strict=True):
        nodes = trained_layer.mlp.learner_nodes
        frozen = torch.ones(model.config.intermediate_size, dtype=torch.bool)
        frozen[nodes] = False
        for proj, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            now = getattr(layer.mlp, proj).parts[0].stored
            learned = getattr(trained_layer.mlp, proj).parts[0].stored
            assert torch.equal(now.index_select(dim, nodes), learned)  # bit for bit
            before = getattr(stock_layer.mlp, proj).parts[0].stored
            assert torch.equal(
                now.index_select(dim, frozen.nonzero()[:, 0]), before.index_select(dim, frozen.nonzero()[:, 0])
            )
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            now, learned = (
                getattr(layer.self_attn, proj).parts[0].stored,
                getattr(trained_layer.self_attn, proj).parts[0].stored,
            )
            assert torch.equal(now, learned)
    ids, _ = right_padded()
    with torch.no_grad():  # the same model; only the order of the FFN's sum differs from the split one
        torch.testing.assert_close(model.next_token_logits(ids), alice.next_token_logits(ids), rtol=1e-5, atol=1e-5)
        assert not torch.equal(model.next_token_logits(ids), stock.next_token_logits(ids))


def test_the_file_keeps_bf16_values_as_their_difference_from_the_gguf(users):
    _, files = users
    raw = files["alice"].read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    values = json.loads(header["__metadata__"]["values"])
    learners = {key: spec for key, spec in values.items() if key.endswith(".learner_weight")}
    assert set(learners) == {f"layers.1.mlp.{p}_proj.learner_weight" for p in ("gate", "up", "down")}
    assert {spec["encoding"] for spec in learners.values()} == {DELTA8}  # one byte a value, exact
    assert not any(key.startswith("layers.0.") for key in values)  # nothing of the frozen bottom layer


def test_swapping_users_a_b_a_is_bit_for_bit_and_unloading_gives_the_stock_model(gguf, users):
    _, files = users
    fresh_alice = weights(far.load_learners(load_lean_model(gguf), files["alice"]))
    fresh_bob = weights(far.load_learners(load_lean_model(gguf), files["bob"]))
    stock = weights(load_lean_model(gguf))
    model = load_lean_model(gguf)
    far.load_learners(model, files["alice"])
    far.load_learners(model, files["bob"])
    assert_same(model, fresh_bob)
    far.load_learners(model, files["alice"])
    assert_same(model, fresh_alice)
    far.unload_learners(model)
    assert_same(model, stock)
    with pytest.raises(ValueError, match="no learners file is loaded"):
        far.unload_learners(model)


@pytest.mark.slow
def test_a_bf16_file_loads_onto_a_base_stored_in_fp32_and_an_fp32_one_only_there(gguf, users, tmp_path):
    _, files = users
    model = far.load_learners(load_lean_model(gguf, torch.float32), files["alice"])
    bf16 = far.load_learners(load_lean_model(gguf), files["alice"])
    q = "layers.1.self_attn.q_proj.parts.0.stored"
    assert torch.equal(model.get_parameter(q), bf16.get_parameter(q).float())  # bf16 values are exact in fp32
    save_trained(train_user(gguf, 2, torch.float32), tmp_path / "fp32.safetensors", base=gguf)
    far.load_learners(load_lean_model(gguf, torch.float32), tmp_path / "fp32.safetensors")
    with pytest.raises(
        LeanLearnersFileError, match=r"load the base with far.models.load_lean_lm\(name, dtype=torch.float32\)"
    ):
        far.load_learners(load_lean_model(gguf), tmp_path / "fp32.safetensors")


def _corrupted(path, tmp_path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # a bit of the last tensor's bytes
    out = tmp_path / "corrupted.safetensors"
    out.write_bytes(bytes(data))
    return out


def _encoder_file(tmp_path):
    model = tiny_model()
    far.reconfigure(model, 0.4, selection="random", seed=3)
    return far.save_learners(model, tmp_path / "encoder.safetensors")


def test_a_file_that_does_not_fit_is_refused_and_the_model_keeps_its_user(gguf, users, tmp_path):
    _, files = users
    other = tmp_path / "other.gguf"
    write_gguf(tiny_hf("llama", seed=1), other)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(files["alice"].read_bytes()[:-100])
    legacy = tmp_path / "legacy.safetensors"
    save_file({"x": torch.zeros(1)}, str(legacy), metadata={"format": "far-lean-trained/1"})
    cases = [
        (_corrupted(files["alice"], tmp_path), "is corrupted"),
        (truncated, "not a readable safetensors file"),
        (_encoder_file(tmp_path), r"encoder's learners file .*far predict --model BASE"),
        (legacy, "earlier far"),
        (tmp_path / "missing.safetensors", "no learners file at"),
    ]
    model = far.load_learners(load_lean_model(gguf), files["alice"])
    holding = weights(model)
    for path, message in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            far.load_learners(model, path)
        assert_same(model, holding)
    # A user of another GGUF file: the base fingerprint (its sha256) does not match.
    foreign = tmp_path / "foreign.safetensors"
    save_trained(train_user(other, 0), foreign, base=other)
    with pytest.raises(LeanLearnersFileError, match="was trained from other.gguf .* not from this model's llama.gguf"):
        far.load_learners(model, foreign)
    assert_same(model, holding)


def test_a_model_that_is_not_the_stock_gguf_model_is_refused(gguf, users):
    trained, files = users
    with pytest.raises(ValueError, match="split for training"):
        far.load_learners(trained["alice"], files["bob"])
    hf = tiny_hf("llama")
    with pytest.raises(ValueError, match="not read from a GGUF file"):
        far.load_learners(from_state_dict(from_hf_config(hf.config), hf.state_dict()), files["bob"])
    model = load_lean_model(gguf)
    model.layers[1].self_attn.q_proj.parts[0].trainable = True
    with pytest.raises(ValueError, match="trainable weights"):
        far.load_learners(model, files["bob"])


def test_a_gguf_file_changed_since_the_model_was_read_is_noticed(tmp_path, users):
    _, files = users
    path = tmp_path / "llama.gguf"
    write_gguf(tiny_hf("llama"), path)
    model = load_lean_model(path)
    path.write_bytes(path.read_bytes() + b"\0" * 32)
    with pytest.raises(ValueError, match="changed .* since this model was read from it"):
        far.load_learners(model, files["alice"])


def test_encoding_is_exact_whatever_the_values_did():
    stock = torch.randn(64, 48)
    value = stock.to(torch.bfloat16)
    bits = value.view(torch.int16)
    bits[0, :5] += torch.tensor([1, -3, 127, -127, 2], dtype=torch.int16)  # a few units of the last place
    value[1, 0], value[2, 1], value[3, 2] = -stock[1, 0], 1e-30, 7.0  # a sign flip, a tiny one, a big jump
    encoding, parts = encode(value, stock)
    assert encoding == DELTA8 and parts[".patch_index"].tolist() == [48, 97, 146]
    assert parts[".patch_index"].dtype == torch.int32  # 6 bytes a patch with its bf16 value
    assert torch.equal(decode(encoding, parts, stock).view(torch.int16), value.view(torch.int16))
    noisy = (stock + torch.randn_like(stock)).to(torch.bfloat16)  # nothing close: raw is smaller
    assert encode(noisy, stock)[0] == RAW and torch.equal(decode(*encode(noisy, stock), stock), noisy)
    assert encode(stock, stock)[0] == RAW  # fp32 values are kept as they are
