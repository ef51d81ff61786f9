"""far.device for a causal LM: the lean runtime's FAR layout as an ExecuTorch program that trains on next tokens.

The parity tests export tiny seeded Llama and Gemma-3 models (the vocabulary read in slices of 32 rows, so the
loss runs over several) and hold the programs to the lean runtime on the same chunks: the bottom's output, the
loss, every gradient and one AdamW step within 1e-4. Exporting takes tens of CPU seconds (ExecuTorch's graph
passes), so those are in the slow tier and skip without executorch; the refusals, made before anything is
built, stay quick.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from test_llm_lean import VOCAB, tiny_hf
from test_lm_texts import char_tokenizer
from test_lm_train import write_tiny_gguf

import far.llm.next_token as next_token
from far.cli.main import main
from far.config import FARConfig
from far.data.texts import TextChunks
from far.device.lm_export import export_causal_lm, plan_lm_export, reconfigure_for_export
from far.device.lm_text import CHUNKS, read_chunks
from far.device.manifest import MANIFEST, NEXT_TOKEN, DeviceFileError, read_manifest
from far.device.optim import update
from far.llm.backprop import LearnerGradients
from far.llm.compact import DenseEmbedding
from far.llm.lean_config import from_hf_config
from far.llm.lean_far import set_trainable, split_ffns
from far.llm.lean_model import from_state_dict
from far.storage.atomic import file_sha256

SLICE, BATCH, LENGTH, LR = 32, 2, 12, 1e-2


def lean(model_type: str):
    hf = tiny_hf(model_type)
    return from_state_dict(from_hf_config(hf.config), hf.state_dict())


def chunks(n: int = BATCH, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(seed))


def reconfigured(model_type: str):
    model = lean(model_type)
    reconfigure_for_export(model, chunks(4, seed=5), FARConfig(0.4), retention_given=True)
    return model


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def exported(request, tmp_path_factory):
    pytest.importorskip("executorch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(next_token, "VOCAB_SLICE", SLICE)  # 97 tokens: four slices
        model = reconfigured(request.param)
        out = tmp_path_factory.mktemp(request.param) / "export"
        export_causal_lm(model, char_tokenizer(), out, batch_size=BATCH, max_length=LENGTH, lr=LR, bottom_xnnpack=False)
        yield model, out


def lean_step(model, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
    """The lean runtime's loss and gradients on `ids`, from its own bottom's output, as `far train` steps."""
    depth = model.lowest_trainable_layer()
    with torch.no_grad():
        bottom = model.run_layers(model.embed(ids), 0, depth)
    with LearnerGradients(model) as gradients, model.input_gradients(), torch.enable_grad():
        loss = model.next_token_loss(ids, start=bottom, start_layer=depth)
        loss.backward()
        loss = loss.detach()
    names = {id(w.stored): f"{name}.stored" for name, w in model.named_modules() if hasattr(w, "stored")}
    grads = {names[id(p)]: p.grad.clone() for p in gradients.parameters()}
    gradients.zero()
    return float(loss), grads, bottom


@pytest.mark.slow
def test_the_programs_give_the_lean_runtimes_bottom_loss_gradients_and_step(exported, monkeypatch):
    from far.device.lm_programs import LMPrograms

    monkeypatch.setattr(next_token, "VOCAB_SLICE", SLICE)
    model, out = exported
    model = copy.deepcopy(model)  # stepped below; the fixture's stays as exported
    manifest = read_manifest(out, objective=NEXT_TOKEN)
    programs = LMPrograms(out, manifest)
    ids = chunks()
    loss, grads, bottom = lean_step(model, ids)
    assert torch.allclose(programs.bottom(ids), bottom, atol=1e-5)
    device_loss, hits = programs.forward_backward({"input_ids": ids})
    assert abs(device_loss - loss) < 1e-4
    assert 0 <= int(hits) <= BATCH * (LENGTH - 1)
    device_grads = programs.gradients()
    assert set(device_grads) == set(grads) == {spec["name"] for spec in manifest["trainable"]}
    for name, grad in grads.items():
        assert torch.allclose(device_grads[name], grad, atol=1e-4), name
    # one AdamW step on each side, with the manifest's settings: the same weights, then the same loss
    params = programs.parameters()
    update(manifest["optimizer"], params, device_grads, {}, 0, LR)
    weights = {f"{name}.stored": w.stored for name, w in model.named_modules() if hasattr(w, "stored")}
    lean_params = {name: weights[name].detach().clone() for name in grads}
    update(manifest["optimizer"], lean_params, grads, {}, 0, LR)
    for name, value in lean_params.items():
        assert torch.allclose(params[name], value, atol=1e-4), name
        assert not torch.equal(value, weights[name]), name  # the step moved it
    with torch.no_grad():
        for name, value in lean_params.items():
            weights[name].copy_(value)
    after, _, _ = lean_step(model, ids)
    device_after, _ = programs.forward_backward({"input_ids": ids})
    assert abs(device_after - after) < 1e-4 and after < loss


@pytest.mark.slow
def test_the_folder_says_what_it_trains_and_classifier_readers_refuse_it(exported):
    model, out = exported
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["objective"] == NEXT_TOKEN and manifest["model_type"] == model.config.arch
    assert manifest["frozen_layers"] == model.lowest_trainable_layer() > 0
    assert manifest["programs"]["train"]["planned_bytes"] > manifest["programs"]["bottom"]["planned_bytes"] > 0
    assert {p.name for p in out.iterdir()} == {
        "manifest.json",
        "train.pte",
        "bottom.pte",
        "tokenizer.json",
        "state.safetensors",
    }
    with pytest.raises(DeviceFileError, match="causal LM's next tokens.*sequence classifier"):
        read_manifest(out)  # far.device.train, to_learners and write_examples read classification exports
    from safetensors.torch import load_file

    weights = {f"{name}.stored": w.stored for name, w in model.named_modules() if hasattr(w, "stored")}
    state = load_file(out / "state.safetensors")
    assert state.keys() == {spec["name"] for spec in manifest["trainable"]}
    for name, value in state.items():
        assert torch.equal(value, weights[name]), name


def test_a_stock_model_is_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="not split by FAR.*reconfigure_for_export"):
        export_causal_lm(lean("llama"), char_tokenizer(), out, batch_size=2, max_length=8, lr=1e-3)
    assert not out.exists()


def test_a_zeroth_order_layout_and_no_frozen_bottom_are_refused():
    model = lean("llama")
    n = model.config.intermediate_size
    split_ffns(model, {f"layers.{i}.mlp.down_proj": torch.arange(0, n, 3) for i in range(2)}, torch.bfloat16)
    set_trainable(model, "learners", torch.bfloat16, frozen_layers=1)
    with pytest.raises(ValueError, match="bfloat16.*AdamW or SGD on float32"):
        plan_lm_export(model, 8)
    set_trainable(model, "learners", torch.float32, frozen_layers=0)
    with pytest.raises(ValueError, match="frozen bottom.*freeze_layers > 0"):
        plan_lm_export(model, 8)


def test_bad_settings_and_foreign_models_are_refused_before_anything_is_written(tmp_path):
    model = reconfigured("llama")
    assert plan_lm_export(model, 8) == 1
    with pytest.raises(ValueError, match="max_length must be a whole number >= 2"):
        plan_lm_export(model, 1)
    with pytest.raises(ValueError, match="not BertForSequenceClassification|export_executorch"):
        plan_lm_export(torch.nn.Linear(2, 2), 8)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds other files"):
        export_causal_lm(model, char_tokenizer(), busy, batch_size=2, max_length=8, lr=1e-3)
    with pytest.raises(ValueError, match="micro_batch_size=3 must divide batch_size=4"):
        export_causal_lm(model, char_tokenizer(), tmp_path / "o", batch_size=4, micro_batch_size=3, max_length=8, lr=1)
    with pytest.raises(ValueError, match="optimizer"):
        export_causal_lm(model, char_tokenizer(), tmp_path / "o", batch_size=2, max_length=8, lr=1, optimizer="mezo")
    texts = TextChunks(torch.zeros(4, 7, dtype=torch.long), torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="chunks of 7 tokens; pack them in max_length=8"):
        export_causal_lm(model, char_tokenizer(), tmp_path / "o", batch_size=2, max_length=8, lr=1, texts=texts)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"] and not (tmp_path / "o").exists()


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    return write_tiny_gguf(tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "minilm"], "not a GGUF causal LM"),
        (["--model", "tiny.gguf", "--checkpoint", "x"], "--checkpoint DIR .* or, with --executorch, --model NAME"),
        (["--model", "tiny.gguf", "--xnnpack", "all"], "--xnnpack all is not available with --model"),
        (["--model", "tiny.gguf", "--schedule", "linear"], "--schedule linear is not available with --model"),
        (["--model", "tiny.gguf", "--learners", "a.safetensors"], "--learners .a.safetensors. is no file"),
        (["--model", "tiny.gguf", "--optimizer", "sgd"], "give --lr with --optimizer sgd"),
        (["--model", "tiny.gguf", "--train-file", "missing/"], "--train-file 'missing' does not exist"),
        (["--checkpoint", "x", "--train-file", "notes/"], "use it with --model NAME"),
    ],
)
def test_the_command_refuses_what_it_cannot_export_before_loading(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--executorch", "out", *flags]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_model_needs_executorch_and_a_busy_folder_is_refused(gguf, tmp_path, capsys):
    assert main(["export", "--model", str(gguf), "--merge", str(tmp_path / "plain")]) == 2
    assert "add --executorch OUT" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("x")
    assert main(["export", "--model", str(gguf), "--executorch", str(tmp_path / "busy")]) == 2
    assert "already holds other files" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["mine.txt"]


@pytest.mark.slow
def test_far_export_writes_a_causal_lm_primed_on_your_texts(gguf, tmp_path, capsys):
    pytest.importorskip("executorch")
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"{i}.txt").write_text("the cat sat on the mat. " * 8)
    out = tmp_path / "device"
    flags = ["--batch-size", "2", "--max-length", "16", "--train-file", str(notes)]
    assert main(["export", "--model", str(gguf), "--executorch", str(out), *flags]) == 0
    printed = capsys.readouterr().out
    assert "chosen by gradient priming on" in printed and "train.pte" in printed, printed
    manifest = read_manifest(out, objective=NEXT_TOKEN)
    assert manifest["base"] == {"gguf": "tiny.gguf", "sha256": file_sha256(gguf)}
    assert (manifest["batch_size"], manifest["micro_batch_size"], manifest["max_length"]) == (2, 1, 16)
    assert manifest["optimizer"]["name"] == "adamw" and manifest["far_config"]["freeze_layers"] == 1
    train, held_out, sha = read_chunks(out / CHUNKS, manifest)  # the notes, packed for the runtimes to train on
    assert train.shape[1] == held_out.shape[1] == 16 and len(held_out) > 0
    counts = {"train_chunks": len(train), "held_out_chunks": len(held_out)}
    assert manifest["text"] == {"file": CHUNKS, "sha256": sha, **counts}


def test_a_reader_refuses_a_folder_of_the_other_objective(tmp_path):
    program = {"file": "train.pte", "sha256": "0" * 64}
    manifest = {"format": "far.device", "format_version": 2, "objective": NEXT_TOKEN, "programs": {"train": program}}
    manifest |= {"batch_size": 2, "max_length": 8, "vocab_size": 97, "optimizer": {"name": "adamw"}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DeviceFileError, match="trains a causal LM's next tokens.*far export --executorch OUT --model"):
        read_manifest(tmp_path, verify_programs=False)
    with pytest.raises(DeviceFileError, match="must name the bottom program"):
        read_manifest(tmp_path, verify_programs=False, objective=NEXT_TOKEN)
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "objective": "classification"}))
    with pytest.raises(DeviceFileError, match="trains a sequence classifier's labels.*--checkpoint DIR"):
        read_manifest(tmp_path, verify_programs=False, objective=NEXT_TOKEN)


def test_the_loss_in_graph_is_the_sliced_loss_with_its_gradient(monkeypatch):
    monkeypatch.setattr(next_token, "VOCAB_SLICE", SLICE)
    generator = torch.Generator().manual_seed(0)
    embedding = DenseEmbedding(torch.randn(VOCAB, 8, generator=generator), torch.float32)
    targets = torch.randint(0, VOCAB, (10,), generator=generator)
    hidden = torch.randn(10, 8, generator=generator, requires_grad=True)
    expected = next_token.next_token_loss(hidden, targets, embedding, VOCAB)
    (expected_grad,) = torch.autograd.grad(expected, hidden)
    loss, hits = next_token.next_token_loss_in_graph(hidden, targets, embedding, VOCAB)
    (grad,) = torch.autograd.grad(loss, hidden)
    assert torch.equal(loss, expected) and torch.allclose(grad, expected_grad, atol=1e-7)
    assert int(hits) == int((hidden @ embedding.weight.t()).argmax(1).eq(targets).sum())


def weight_transposes(program) -> int:
    """The matrix products in a lowered program whose second operand is a transpose written out first, and the
    transposes of a transpose (ExecuTorch's transposes are copies)."""
    nodes = program.exported_program().graph_module.graph.nodes
    calls = [n for n in nodes if n.op == "call_function"]
    products = [n for n in calls if str(n.target).endswith("aten.mm.out")]
    transposes = [n for n in calls if str(n.target).endswith("permute_copy.out")]
    read = lambda n, i: str(getattr(n.args[i], "target", "")).endswith("permute_copy.out")  # noqa: E731
    return sum(read(n, 1) for n in products) + sum(read(n, 0) for n in transposes)


@pytest.mark.slow
def test_recomputing_in_backward_plans_less_and_gives_the_same_outputs_bit_for_bit(monkeypatch):
    pytest.importorskip("executorch")
    from executorch.extension.pybindings import portable_lib

    from far.device.lm_view import lm_views
    from far.device.lowering import training_program

    monkeypatch.setattr(next_token, "VOCAB_SLICE", SLICE)
    model = reconfigured("llama")
    _, top = lm_views(model, model.lowest_trainable_layer())
    ids = chunks()
    hidden = torch.randn(BATCH, LENGTH, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    planned, outputs = {}, {}
    for recompute in (False, True):
        program, _ = training_program(top, (hidden, ids), recompute=recompute)
        planned[recompute] = sum(program.executorch_program.execution_plan[0].non_const_buffer_sizes)
        assert weight_transposes(program) == 0  # products read their weights as they lie (`linear`)
        module = portable_lib._load_for_executorch_from_buffer(program.buffer)
        outputs[recompute] = [t.clone() for t in module.run_method("forward", [hidden, ids])]
    # the tiny model's one trained layer: its activations and its weights' fp32 reads are no longer planned
    # alongside each other (SmolLM2's ten layers: docs/device.md)
    assert planned[True] < 0.9 * planned[False]
    assert len(outputs[True]) == len(outputs[False])
    for kept, again in zip(outputs[False], outputs[True], strict=True):
        assert torch.equal(kept, again)
