"""Generation on the device: a causal LM export's generate.pte (`far export --model FILE --executorch OUT --generate`)
writes the tokens `far generate` writes for the same prompt, with the export's state and after training.

Tiny Llama and Gemma-3 GGUF files whose weights are bf16 values are exported with notes; the generate program,
through ExecuTorch's Python bindings, gives the lean runtime's logits at every position (within 1e-4) and its
greedy tokens. With bf16 weights, the lean model loaded in fp32 (as `far generate` loads it for a float32 learners
file) is the export's model exactly, so the tokens after training compare too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_lm_texts import char_tokenizer
from test_lm_train import write_tiny_gguf

from far.cli.main import main
from far.device.lm_generate import greedy_ids
from far.device.manifest import GENERATE, NEXT_TOKEN, read_manifest
from far.device.state import read_state
from far.llm.generate import GenerationConfig, generate
from far.llm.gguf_file import load_lean_model

PROMPT, NEW_TOKENS, CACHE = "the cat", 8, 24


@dataclass
class GenerateExport:
    gguf: Path
    out: Path
    manifest: dict


def export_generating(folder: Path, model_type: str):
    """A tiny GGUF model of `model_type` (bf16 weights) exported with notes and `--generate CACHE`."""
    pytest.importorskip("executorch")
    notes = folder / "notes"
    notes.mkdir()
    for i in range(12):
        (notes / f"{i:02d}.txt").write_text(f"note {i}: the cat sat on the mat. " * 5)
    with pytest.MonkeyPatch.context() as patch:
        gguf = write_tiny_gguf(folder, patch, model_type, bf16_exact=True)
        out = folder / "out"
        flags = ["--batch-size", "2", "--micro-batch-size", "1", "--max-length", "16", "--lr", "0.01"]
        argv = ["export", "--model", str(gguf), "--executorch", str(out), "--train-file", str(notes)]
        assert main([*argv, *flags, "--generate", str(CACHE)]) == 0
        yield GenerateExport(gguf, out, read_manifest(out, objective=NEXT_TOKEN))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--checkpoint", "x", "--generate"], "use it with --model NAME --executorch OUT"),
        (["--model", "tiny.gguf", "--generate", "1"], "2 to 65536 positions"),
        (["--model", "tiny.gguf", "--generate", "many"], "invalid int value"),
    ],
)
def test_the_command_refuses_a_generate_program_it_cannot_write_before_loading(
    tmp_path, capsys, monkeypatch, flags, message
):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--executorch", "out", *flags]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_prompt_longer_than_the_cache_is_refused_before_any_call():
    calls = []
    with pytest.raises(ValueError, match="need 12 positions; the generate program keeps 8"):
        greedy_ids(lambda *a: calls.append(a), list(range(5)), 8, None, 8)
    assert not calls


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def generating(request, tmp_path_factory) -> GenerateExport:
    yield from export_generating(tmp_path_factory.mktemp(f"generate_{request.param}"), request.param)


def program_step(export: GenerateExport, state: Path):
    """generate.pte through ExecuTorch's bindings, given the state's tensors: (token, position) -> logits."""
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(export.out / GENERATE).load_method("forward")
    tensors = read_state(state, export.manifest).tensors
    trained = [tensors[spec["name"]] for spec in export.manifest["trainable"]]
    return lambda token, position: method.execute([token, position, *trained])[0]


def prompt_ids() -> list[int]:
    return char_tokenizer()(PROMPT)["input_ids"]


@pytest.mark.slow
@pytest.mark.device
def test_the_manifest_records_the_generate_program(generating):
    program = generating.manifest["programs"]["generate"]
    assert program["file"] == GENERATE and [i["name"] for i in program["inputs"]] == ["token", "position"]
    assert generating.manifest["generate"]["cache_length"] == CACHE


@pytest.mark.slow
@pytest.mark.device
def test_the_program_gives_the_lean_runtimes_logits_and_tokens(generating):
    step = program_step(generating, generating.out / "state.safetensors")
    model = load_lean_model(generating.gguf)  # bf16, as far generate loads it without learners
    cache = model.new_cache()
    ids = [*prompt_ids(), 5, 40, 3, 77, 12, 9, 60, 2, 33, 17]  # past gemma's sliding window of 4
    for position, token in enumerate(ids):
        expected = model.next_token_logits(torch.tensor([[token]]), cache)
        got = step(torch.tensor([[token]]), torch.tensor([position]))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    lean = generate(model, prompt_ids(), GenerationConfig(max_new_tokens=NEW_TOKENS), eos_token_id=1)
    assert greedy_ids(step, prompt_ids(), NEW_TOKENS, 1, CACHE) == lean
