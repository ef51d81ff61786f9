"""Generation on the device: a causal LM export's generate.pte (`far export --model FILE --executorch OUT --generate`)
writes the tokens `far generate` writes for the same prompt, with the export's state and after training.

Tiny Llama and Gemma-3 GGUF files whose weights are bf16 values are exported with notes; the generate program,
through ExecuTorch's Python bindings, gives the lean runtime's logits at every position (within 1e-4) and its
greedy tokens. With bf16 weights, the lean model loaded in fp32 (as `far generate` loads it for a float32 learners
file) is the export's model exactly, so the tokens after training compare too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_device_lm import reconfigured
from test_device_runner import runner  # noqa: F401  (the session's far_train build, far_generate beside it)
from test_lm_texts import char_tokenizer
from test_lm_train import write_tiny_gguf

from far.cli.main import main
from far.device.lm_generate import LMDecoder, generation_program, greedy_ids
from far.device.manifest import GENERATE, MANIFEST, NEXT_TOKEN, read_manifest
from far.device.state import read_state, write_state
from far.llm.generate import GenerationConfig, generate
from far.llm.gguf import CACHE_ENV
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import load_learners

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
        (["--executorch", "out", "--checkpoint", "x", "--generate"], "use it with --model NAME --executorch OUT"),
        (["--executorch", "out", "--model", "tiny.gguf", "--generate", "1"], "2 to 65536 positions"),
        (["--executorch", "out", "--model", "tiny.gguf", "--generate", "many"], "invalid int value"),
        (["--from-executorch", "out", "--learners-only", "l.safetensors", "--generate"], "--generate: not used with"),
    ],
)
def test_the_command_refuses_a_generate_program_it_cannot_write_before_loading(
    tmp_path, capsys, monkeypatch, flags, message
):
    monkeypatch.chdir(tmp_path)
    assert main(["export", *flags]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_prompt_longer_than_the_cache_is_refused_before_any_call():
    calls = []
    with pytest.raises(ValueError, match="need 12 positions; the generate program keeps 8"):
        greedy_ids(lambda *a: calls.append(a), list(range(5)), 8, None, 8)
    assert not calls


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_the_decoding_view_gives_the_lean_runtimes_logits_and_greedy_tokens(model_type):
    """The generate program's module in eager torch (no executorch): the lean model's logits at every position."""
    model = reconfigured(model_type)
    with torch.no_grad():  # trained values away from the stock ones, as after training
        for weight in model.trainable_weights():
            weight.stored.add_(0.05 * torch.randn(weight.stored.shape, generator=torch.Generator().manual_seed(1)))
    decoder = LMDecoder(model, CACHE).eval()
    cache, ids = model.new_cache(), [5, 17, 33, 2, 40, 41, 7, 9, 60, 3]  # past gemma's sliding window of 4
    for position, token in enumerate(ids):
        expected = model.next_token_logits(torch.tensor([[token]]), cache)
        with torch.no_grad():
            got = decoder(torch.tensor([[token]]), torch.tensor([position]))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    decoder = LMDecoder(model, CACHE).eval()  # a fresh cache
    lean = generate(model, ids[:4], GenerationConfig(max_new_tokens=NEW_TOKENS), eos_token_id=1)
    assert greedy_ids(decoder, ids[:4], NEW_TOKENS, 1, CACHE) == lean


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


# --- far_generate, the C++ runner's generation (built with far_train) ---


@pytest.fixture(scope="module")
def far_generate(runner) -> Path:  # noqa: F811
    return runner.parent / "far_generate"


def run_far_generate(binary: Path, out: Path, state: Path, ids: list[int], *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(binary), str(out), "--state", str(state), "--prompt-ids", ",".join(map(str, ids)), "--threads", "1"]
    return subprocess.run([*cmd, "--max-new-tokens", str(NEW_TOKENS), *extra], capture_output=True, text=True)


def written(done: subprocess.CompletedProcess) -> tuple[list[int], str]:
    """far_generate's written ids and their text."""
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.match(r"ids=([\d,]+)\ntext:\n(.*)\n\Z", done.stdout, re.S)
    assert found, done.stdout
    return [int(i) for i in found[1].split(",")], found[2]


def far_generate_text(export: GenerateExport, capsys, *learners: str) -> str:
    """What `far generate` prints for the prompt (with a learners file, if given)."""
    capsys.readouterr()
    argv = ["generate", "--model", str(export.gguf), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(export.gguf.parent / "cache"))  # the tiny model's tokenizer
        assert main([*argv, *(["--learners", *learners] if learners else [])]) == 0
    return capsys.readouterr().out.removesuffix("\n")


@pytest.mark.slow
@pytest.mark.device
def test_far_generate_writes_far_generates_tokens_before_and_after_training(generating, far_generate, tmp_path, capsys):
    lean = generate(load_lean_model(generating.gguf), prompt_ids(), GenerationConfig(NEW_TOKENS), eos_token_id=1)
    ids, text = written(
        run_far_generate(far_generate, generating.out, generating.out / "state.safetensors", prompt_ids())
    )
    assert ids == lean and text == far_generate_text(generating, capsys)
    # Trained on the runner, then the state both ways: far_generate reads it as it is; far generate as the learners
    # file of its float32 values (the base then loads in float32: the export's bf16 weights exactly).
    state = tmp_path / "user.safetensors"
    shutil.copy(generating.out / "state.safetensors", state)
    chunks = generating.out / "text.safetensors"
    train = [str(runner_of(far_generate)), str(generating.out), "--examples", str(chunks), "--state", str(state)]
    done = subprocess.run([*train, "--epochs", "3", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    learners = tmp_path / "l.safetensors"
    convert = [
        "export",
        "--from-executorch",
        str(generating.out),
        "--state",
        str(state),
        "--model",
        str(generating.gguf),
    ]
    assert main([*convert, "--learners-only", str(learners), "--values-dtype", "float32"]) == 0
    trained = load_learners(load_lean_model(generating.gguf, torch.float32), learners)
    lean_trained = generate(trained, prompt_ids(), GenerationConfig(NEW_TOKENS), eos_token_id=1)
    ids_trained, text_trained = written(run_far_generate(far_generate, generating.out, state, prompt_ids()))
    assert ids_trained == lean_trained and text_trained == far_generate_text(generating, capsys, str(learners))
    assert ids_trained != ids  # the trained tensors are the state's, not the export's


def runner_of(binary: Path) -> Path:
    return binary.parent / "far_train"


@pytest.mark.slow
@pytest.mark.device
def test_far_generate_refuses_before_generating(generating, far_generate, tmp_path):
    manifest, state = generating.manifest, generating.out / "state.safetensors"
    other = tmp_path / "other.safetensors"  # a state of another export: its training program differs
    programs = {**manifest["programs"], "train": {**manifest["programs"]["train"], "sha256": "0" * 64}}
    write_state(other, read_state(state, manifest), {**manifest, "programs": programs})
    no_generate = tmp_path / "no_generate"
    shutil.copytree(generating.out, no_generate)
    edited = {k: v for k, v in manifest.items() if k != "generate"}  # an export without --generate
    edited["programs"] = {k: v for k, v in manifest["programs"].items() if k != "generate"}
    (no_generate / MANIFEST).write_text(json.dumps(edited))
    cases = [
        (generating.out, other, prompt_ids(), "was written for another training program"),
        (
            generating.out,
            state,
            list(range(2, 2 + CACHE)),
            f"need {CACHE + NEW_TOKENS - 1} positions; generate.pte keeps",
        ),
        (generating.out, state, [*prompt_ids(), 10_000], "10000 is not a token id of this vocabulary"),
        (no_generate, state, prompt_ids(), "has no generate program (generate.pte); export it with far export"),
    ]
    for out, state_path, ids, message in cases:
        done = run_far_generate(far_generate, out, state_path, ids)
        assert done.returncode == 2 and message in done.stderr, (message, done.stderr)
        assert "ids=" not in done.stdout


@pytest.mark.slow
@pytest.mark.device
def test_the_program_holds_its_cache_as_zeros():
    """ExecuTorch serializes only the shape of a buffer the program updates, unless asked: the cache's memory would
    start as the runtime finds it, and a masked position's NaN would still reach the output (0 * NaN)."""
    pytest.importorskip("executorch")
    model = reconfigured("llama")
    decoder = LMDecoder(model, CACHE)
    plan = generation_program(decoder, list(decoder.trained())).executorch_program.execution_plan[0]
    tensors = [v.val for v in plan.values if type(v.val).__name__ == "Tensor"]
    initialized = [t for t in tensors if t.allocation_info is not None and t.data_buffer_idx > 0]
    assert len(initialized) == 2 * len(model.layers)  # each layer's keys and values, planned and with a value
