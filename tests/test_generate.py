"""Generation on the lean runtime: next-token logits, the KV cache and greedy decoding against transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from test_llm_lean import VOCAB, tiny_hf, write_gguf
from test_llm_learners_file import train_user

import far
from far.cli.main import main
from far.llm.generate import GenerationConfig, generate, sampling_weights
from far.llm.gguf_file import load_lean_model
from far.llm.lean_config import from_hf_config
from far.llm.lean_model import from_state_dict
from far.llm.lean_saving import save_trained
from far.llm.tokenizer import load_gguf_tokenizer


def pair(model_type: str):
    """A tiny transformers model and the lean model of its weights; the Llama's scaled up, as its greedy path
    otherwise repeats one token, which would not tell a wrong next token from a right one."""
    hf = tiny_hf(model_type)
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(3.0 if model_type == "llama" else 1.0)
    return hf, from_state_dict(from_hf_config(hf.config), hf.state_dict())


def prompt(length: int = 7, seed: int = 3) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_next_token_logits_are_the_last_positions_logits(model_type):
    hf, lean = pair(model_type)
    ids = torch.tensor([prompt(9)])
    with torch.no_grad():
        torch.testing.assert_close(lean.next_token_logits(ids), hf(ids).logits[:, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(lean.next_token_logits(ids), lean.logits(ids)[:, -1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_decoding_over_the_cache_gives_every_positions_logits(model_type):
    # Gemma's sliding window is 4 tokens here: after 9 tokens, its window mask decides what a query sees.
    hf, lean = pair(model_type)
    ids = torch.tensor([prompt(9)])
    cache = lean.new_cache()
    with torch.no_grad():
        full = hf(ids).logits[0]  # (T, vocab)
        stepped = [lean.next_token_logits(ids[:, :3], cache)[0]]
        stepped += [lean.next_token_logits(ids[:, t : t + 1], cache)[0] for t in range(3, ids.shape[1])]
    assert cache.seen(0) == ids.shape[1]
    torch.testing.assert_close(torch.stack(stepped), full[2:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_greedy_generation_writes_what_transformers_writes(model_type):
    hf, lean = pair(model_type)
    ids = prompt(6)
    expected = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, 6, dtype=torch.long),
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, 6:].tolist()
    assert len(set(expected)) > 3  # a path that would catch a wrong step
    assert generate(lean, ids, GenerationConfig(max_new_tokens=8)) == expected


def test_generation_stops_at_the_end_of_text_token():
    _, lean = pair("llama")
    ids = prompt(6)
    free = generate(lean, ids, GenerationConfig(max_new_tokens=8))
    stopped = generate(lean, ids, GenerationConfig(max_new_tokens=8), eos_token_id=free[2])
    assert stopped == free[: free.index(free[2]) + 1]


@pytest.mark.slow
def test_sampling_follows_its_seed_and_its_cut_offs():
    _, lean = pair("llama")
    ids = prompt(6)
    sampled = GenerationConfig(max_new_tokens=10, temperature=1.5, seed=1)
    first = generate(lean, ids, sampled)
    assert generate(lean, ids, sampled) == first  # the same seed, the same text
    others = {tuple(generate(lean, ids, GenerationConfig(10, 1.5, seed=s))) for s in range(2, 6)}
    assert others - {tuple(first)}  # other seeds write other texts
    greedy = generate(lean, ids, GenerationConfig(max_new_tokens=10))
    assert generate(lean, ids, GenerationConfig(10, 1.5, top_k=1, seed=4)) == greedy
    assert generate(lean, ids, GenerationConfig(10, 1.5, top_p=1e-6, seed=4)) == greedy


def test_top_k_and_top_p_keep_the_most_likely_tokens():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0])
    kept = sampling_weights(logits, GenerationConfig(temperature=1.0, top_k=2))
    assert kept.nonzero().squeeze(1).tolist() == [1, 3]
    probs = torch.softmax(logits, 0)  # 0.64, 0.24, 0.09, ...: p = 0.8 keeps the first two
    kept = sampling_weights(logits, GenerationConfig(temperature=1.0, top_p=0.8))
    assert kept.nonzero().squeeze(1).tolist() == [1, 3]
    torch.testing.assert_close(kept[[1, 3]], probs[[1, 3]] / probs[[1, 3]].sum())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_new_tokens", 0, "max_new_tokens must be an int >= 1"),
        ("temperature", -0.5, "temperature must be a finite number >= 0"),
        ("top_k", 0, "top_k must be an int >= 1"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**{field: value})


def test_a_bad_prompt_is_refused():
    _, lean = pair("llama")
    with pytest.raises(ValueError, match="no tokens"):
        generate(lean, [])
    with pytest.raises(ValueError, match=rf"must lie in \[0, {VOCAB}\)"):
        generate(lean, [1, VOCAB])


@pytest.fixture(scope="module")
def tiny_gguf_with_users(tmp_path_factory):
    """A tiny Llama GGUF file with a byte-level vocabulary, and two users' learners files for it."""
    folder = tmp_path_factory.mktemp("generate")
    gguf = folder / "tiny.gguf"
    vocabulary = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "<|endoftext|>"]  # Ġ: a space, Ċ: a newline
    hf, _ = pair("llama")  # scaled up: its greedy text varies
    write_gguf(hf, gguf, vocabulary)
    files = []
    for name, seed in (("alice", 0), ("bob", 1)):  # large steps: users whose texts differ
        save_trained(train_user(gguf, seed, lr=0.05), folder / f"{name}.safetensors", base=gguf)
        files.append(folder / f"{name}.safetensors")
    return gguf, files


@pytest.mark.slow
def test_far_generate_writes_each_users_text_from_one_process(tiny_gguf_with_users, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAR_CACHE", str(tmp_path / "cache"))  # the tokenizer is converted once, here
    gguf, (alice, bob) = tiny_gguf_with_users
    tokenizer = load_gguf_tokenizer(gguf)
    prompt = tokenizer("Hello world")["input_ids"]

    def expected(learners) -> str:
        model = load_lean_model(gguf)
        if learners is not None:
            far.load_learners(model, learners)
        return tokenizer.decode(generate(model, prompt, GenerationConfig(6), tokenizer.eos_token_id))

    args = ["generate", "--model", str(gguf), "--prompt", "Hello world", "--max-new-tokens", "6"]
    assert main(args) == 0
    assert capsys.readouterr().out == expected(None) + "\n"
    assert main([*args, "--learners", str(alice), str(bob)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"== {alice} ==\n{expected(alice)}\n== {bob} ==\n{expected(bob)}\n"
    assert f"{alice} applied in" in captured.err
    assert expected(alice) != expected(bob)  # the users' models write differently
    corrupted = tmp_path / "corrupted.safetensors"
    corrupted.write_bytes(alice.read_bytes()[:-100])
    assert main([*args, "--learners", str(corrupted), str(bob)]) == 1  # the other user is still served
    captured = capsys.readouterr()
    assert f"skipped {corrupted}" in captured.err and f"== {bob} ==\n{expected(bob)}\n" in captured.out
    sampled = [*args, "--learners", str(bob), "--temperature", "1.0", "--seed", "7"]
    assert main(sampled) == 0
    first = capsys.readouterr().out
    assert main(sampled) == 0 and capsys.readouterr().out == first


def test_far_generate_refuses_bad_settings_before_loading(tmp_path, capsys):
    missing = tmp_path / "nobody.safetensors"
    assert main(["generate", "--model", "nowhere.gguf", "--prompt", "x", "--learners", str(missing)]) == 2
    assert f"no such file {str(missing)!r}" in capsys.readouterr().err
    assert main(["generate", "--model", "nowhere.gguf", "--prompt", "x", "--temperature", "-1"]) == 2
    assert "temperature must be a finite number >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_the_generate_command_path_imports_neither_datasets_nor_transformers():
    code = (
        "import sys, far, far.cli.main, far.cli.common, far.cli.generate, far.learners_swap; "
        "print(sorted(m for m in ('datasets', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_far_generate_loads_the_base_in_float32_for_a_first_order_users_file(tiny_gguf_with_users, tmp_path, capsys):
    # A first-order run keeps its learners in float32 and writes them so; a bfloat16 base cannot hold them.
    gguf, (_, bob) = tiny_gguf_with_users
    carol = tmp_path / "carol.safetensors"
    save_trained(train_user(gguf, 2, dtype=torch.float32, lr=0.05), carol, base=gguf)
    args = ["generate", "--model", str(gguf), "--prompt", "Hello world", "--max-new-tokens", "4"]
    assert main([*args, "--learners", str(carol), str(bob)]) == 0
    captured = capsys.readouterr()
    assert "skipped" not in captured.err
    assert f"== {carol} ==" in captured.out and f"== {bob} ==" in captured.out
