"""far.device: a FAR model exported as ExecuTorch programs, trained there, and brought back as a learners file.

The central test is a parity test: three SGD steps with momentum in ExecuTorch land where the same
three steps in torch eager land (learners within 1e-5, frozen tensors bit for bit), and the
learners file the state becomes gives the device program's logits. The tests that export or train are marked
`device` (they need executorch); the refusals made before exporting and the batch order run without it. Exporting
takes 7-13 CPU s (ExecuTorch's graph passes), so most tests that read the export are in the slow tier; the
refusals made before exporting stay in the quick one.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import kill_child_at, tiny_model, write_rows
from safetensors.torch import load_file
from test_fuzz_readers import COUNTS as FUZZ_COUNTS
from test_fuzz_readers import fuzz, json_mutations, safetensors_mutations
from transformers import AutoTokenizer, BertForSequenceClassification

import far
import far.device as device
from far.cli.main import main
from far.device.examples import read_examples
from far.device.manifest import MANIFEST, DeviceFileError, read_manifest
from far.device.order import epoch_order
from far.device.runtime import DevicePrograms
from far.device.state import read_state, write_state
from far.models import load_model_and_tokenizer

BATCH, LENGTH, LR, MOMENTUM = 4, 16, 0.05, 0.9
CONFIG = far.FARConfig(retention=0.25, selection="random", freeze_embeddings=True, freeze_layers=1)
TEXTS = [f"review {i}: the film was {('dull', 'fine', 'wonderful')[i % 3]} and {i} people came" for i in range(12)]
LABELS = [("bad", "ok", "good")[i % 3] for i in range(12)]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def stock(tokenizer) -> torch.nn.Module:
    """The tiny BERT base every test starts from, with MiniLM's vocabulary and three named classes."""
    model = tiny_model("bert", num_labels=3, vocab_size=tokenizer.vocab_size, max_position_embeddings=32)
    model.config.id2label = {0: "bad", 1: "ok", 2: "good"}
    model.config.label2id = {"bad": 0, "ok": 1, "good": 2}
    return model


@pytest.fixture(scope="module")
def far_model(tokenizer):
    return far.reconfigure(stock(tokenizer), CONFIG)


@pytest.fixture(scope="module")
def exported(far_model, tokenizer, tmp_path_factory):
    """The export folder (bottom without XNNPACK, which lowers in seconds), with 12 examples: 3 batches an epoch."""
    out = tmp_path_factory.mktemp("device") / "out"
    device.export_executorch(
        far_model,
        tokenizer,
        out,
        batch_size=BATCH,
        max_length=LENGTH,
        lr=LR,
        momentum=MOMENTUM,
        xnnpack=False,
        bottom_xnnpack=False,
    )
    device.write_examples(TEXTS, tokenizer, out, out / "examples.safetensors", labels=LABELS)
    return out


def eager_steps(model: torch.nn.Module, examples: dict, epochs: int) -> tuple[torch.nn.Module, list[float]]:
    """The same SGD steps in torch eager, on the batches the device run takes (no dropout, as on the device)."""
    model = copy.deepcopy(model).eval()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    n, losses = examples["labels"].shape[0], []
    for epoch in range(epochs):
        order = torch.from_numpy(epoch_order(0, epoch, n))
        for batch in range(n // BATCH):
            rows = order[batch * BATCH : (batch + 1) * BATCH]
            optimizer.zero_grad()
            loss = model(**{k: v[rows] for k, v in examples.items()}).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


@pytest.mark.slow
@pytest.mark.device
def test_the_folder_holds_both_programs_and_the_step_0_state(exported, far_model, tmp_path):
    manifest = read_manifest(exported)
    assert {p.name for p in exported.iterdir()} >= {"manifest.json", "train.pte", "bottom.pte", "tokenizer.json"}
    assert (manifest["bottom"], manifest["frozen_layers"], manifest["batch_size"]) == (True, 1, BATCH)
    assert manifest["task"] == {"kind": "classification", "labels": ["bad", "ok", "good"], "num_labels": 3}
    assert manifest["learners"] == {k: v.tolist() for k, v in far.learners(far_model).items()}
    trainable = {n for n, p in far_model.named_parameters() if p.requires_grad}
    assert {spec["name"] for spec in manifest["trainable"]} == trainable
    # Step 0 holds the model's values under the learners file's names and layouts.
    far.save_learners(far_model, tmp_path / "model.safetensors")
    saved = load_file(tmp_path / "model.safetensors")
    state = read_state(exported / "state.safetensors", manifest)
    assert state.step == 0 and not state.momentum
    for name, value in state.tensors.items():
        assert torch.equal(value, saved[name]), name


@pytest.mark.slow
@pytest.mark.device
def test_three_sgd_steps_in_executorch_match_torch_eager(exported, far_model, tokenizer, tmp_path):
    manifest = read_manifest(exported)
    result = device.train(exported, exported / "examples.safetensors", epochs=1, state_path=tmp_path / "s.safetensors")
    assert result.step == 3
    examples, _ = read_examples(exported / "examples.safetensors", manifest)
    eager, losses = eager_steps(far_model, examples, epochs=1)
    np.testing.assert_allclose(result.losses, losses, atol=1e-5)
    far.save_learners(eager, tmp_path / "eager.safetensors")
    expected = load_file(tmp_path / "eager.safetensors")
    state = read_state(result.state_path, manifest)
    assert len(state.momentum) == len(state.tensors)
    for name, value in state.tensors.items():
        torch.testing.assert_close(value, expected[name], atol=1e-5, rtol=0, msg=name)
    # Back in far: the frozen tensors are the eager run's (the stock model's), bit for bit.
    device.to_learners(exported, result.state_path, stock(tokenizer), tmp_path / "device.safetensors")
    loaded = far.load_learners(stock(tokenizer), tmp_path / "device.safetensors")
    trained = {n for n, p in eager.named_parameters() if p.requires_grad}
    frozen = {k: v for k, v in eager.state_dict().items() if k not in trained}
    got = loaded.state_dict()
    for name, value in frozen.items():
        assert torch.equal(got[name], value), name


@pytest.mark.slow
@pytest.mark.device
def test_the_learners_file_gives_the_device_programs_logits(exported, tokenizer, tmp_path):
    manifest = read_manifest(exported)
    result = device.train(exported, exported / "examples.safetensors", epochs=1, state_path=tmp_path / "s.safetensors")
    path = device.to_learners(exported, result.state_path, stock(tokenizer), tmp_path / "user.safetensors")
    examples, _ = read_examples(exported / "examples.safetensors", manifest)
    batch = {k: v[:BATCH] for k, v in examples.items()}
    programs = DevicePrograms(exported, manifest)
    programs.forward_backward(batch)  # makes the program's tensors reachable
    programs.load(read_state(result.state_path, manifest).tensors)
    _, logits = programs.forward_backward(batch)
    model = far.load_learners(stock(tokenizer), path).eval()
    with torch.no_grad():
        expected = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert model.config.id2label == {0: "bad", 1: "ok", 2: "good"}


@pytest.mark.slow
@pytest.mark.device
def test_a_state_file_of_another_base_is_refused_and_nothing_changes(exported, tokenizer, tmp_path):
    manifest = read_manifest(exported)
    state = read_state(exported / "state.safetensors", manifest)
    other = {**manifest, "base_fingerprint": "0" * 64}  # as another base's export records it
    other["programs"] = {"train": {**manifest["programs"]["train"], "sha256": "1" * 64}}
    foreign = write_state(tmp_path / "foreign.safetensors", state, other)
    before = foreign.read_bytes()
    with pytest.raises(DeviceFileError, match="another base model"):
        device.train(exported, exported / "examples.safetensors", state_path=foreign, resume=True)
    with pytest.raises(DeviceFileError, match="another base model"):
        device.to_learners(exported, foreign, stock(tokenizer), tmp_path / "user.safetensors")
    assert foreign.read_bytes() == before and not (tmp_path / "user.safetensors").exists()


@pytest.mark.slow
@pytest.mark.device
def test_a_stock_model_of_another_base_is_refused(exported, tokenizer, tmp_path):
    other = stock(tokenizer)
    with torch.no_grad():
        other.bert.embeddings.word_embeddings.weight[5] += 1  # frozen on the device: another base
    with pytest.raises(DeviceFileError, match="not the base this export was made from"):
        device.to_learners(exported, exported / "state.safetensors", other, tmp_path / "user.safetensors")
    assert not (tmp_path / "user.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
@pytest.mark.device
def test_a_damaged_state_file_is_refused_and_nothing_changes(exported, tmp_path, damage):
    data = (exported / "state.safetensors").read_bytes()
    path = tmp_path / "state.safetensors"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])
    before = path.read_bytes()
    with pytest.raises(DeviceFileError, match="truncated or damaged" if damage == "truncated" else "is damaged"):
        device.train(exported, exported / "examples.safetensors", state_path=path, resume=True)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["state.safetensors"]


@pytest.mark.device
@pytest.mark.slow
def test_sgd_without_momentum_trains_and_saves_a_state_without_optimizer_slots(exported, tmp_path):
    out = tmp_path / "plain-sgd"
    shutil.copytree(exported, out)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["optimizer"]["momentum"] = 0.0  # the same programs: the update is the runner's
    (out / MANIFEST).write_text(json.dumps(manifest))
    result = device.train(out, out / "examples.safetensors", epochs=1, state_path=tmp_path / "s.safetensors")
    state = read_state(result.state_path, read_manifest(out))
    assert result.step == state.step == 3 and state.slots == {}


@pytest.mark.device
@pytest.mark.slow
def test_eval_examples_are_scored_as_the_trained_model_scores_them_and_training_is_unchanged(
    exported, tokenizer, tmp_path
):
    examples, manifest = exported / "examples.safetensors", read_manifest(exported)
    plain = device.train(exported, examples, epochs=1, state_path=tmp_path / "plain.safetensors")
    state_path = tmp_path / "scored.safetensors"
    result = device.train(exported, examples, epochs=1, state_path=state_path, eval_examples=examples, eval_every=2)
    assert result.losses == plain.losses and [e["step"] for e in result.evaluations] == [2, 3]
    a, b = read_state(plain.state_path, manifest), read_state(state_path, manifest)
    assert all(torch.equal(a.tensors[name], b.tensors[name]) for name in a.tensors)
    model = far.load_learners(
        stock(tokenizer), device.to_learners(exported, state_path, stock(tokenizer), tmp_path / "user.safetensors")
    ).eval()
    data, _ = read_examples(examples, manifest)
    with torch.no_grad():
        outputs = [model(**{k: v[i : i + BATCH] for k, v in data.items()}) for i in range(0, len(TEXTS), BATCH)]
    accuracy = torch.cat([o.logits.argmax(-1) for o in outputs]).eq(data["labels"]).double().mean()
    assert result.evaluations[-1]["loss"] == pytest.approx(sum(float(o.loss) for o in outputs) / len(outputs), abs=1e-5)
    assert result.evaluations[-1]["accuracy"] == pytest.approx(float(accuracy))


CHILD = """
import sys, time
import far.device

def on_step(step, loss):
    if step == 2:  # its checkpoint is written: stop here and wait for the kill
        print("step 2", flush=True)
        time.sleep(600)

far.device.train(sys.argv[1], sys.argv[2], epochs=2, state_path=sys.argv[3], checkpoint_every=1, on_step=on_step)
"""


@pytest.mark.slow
@pytest.mark.device
def test_a_run_stopped_after_a_checkpoint_resumes_to_the_same_state(exported, tmp_path):
    examples = exported / "examples.safetensors"
    whole = device.train(exported, examples, epochs=2, state_path=tmp_path / "whole.safetensors")

    def crash(step: int, loss: float) -> None:
        if step == 4:  # in the second epoch, with momentum built up
            raise KeyboardInterrupt

    stopped = tmp_path / "stopped.safetensors"
    with pytest.raises(KeyboardInterrupt):
        device.train(exported, examples, epochs=2, state_path=stopped, checkpoint_every=2, on_step=crash)
    manifest = read_manifest(exported)
    assert read_state(stopped, manifest).step == 4
    with pytest.raises(ValueError, match="at step 4; pass resume=True"):
        device.train(exported, examples, epochs=2, state_path=stopped)
    resumed = device.train(exported, examples, epochs=2, state_path=stopped, resume=True)
    assert resumed.losses == whole.losses[4:]
    a, b = read_state(whole.state_path, manifest), read_state(stopped, manifest)
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]) and torch.equal(a.momentum[name], b.momentum[name])


@pytest.mark.slow
@pytest.mark.device
def test_a_run_killed_mid_training_resumes_to_the_same_state(exported, tmp_path):
    examples = exported / "examples.safetensors"
    whole = device.train(exported, examples, epochs=2, state_path=tmp_path / "whole.safetensors")
    killed = tmp_path / "killed.safetensors"
    kill_child_at(CHILD, exported, examples, killed, line="step 2", timeout=60)
    manifest = read_manifest(exported)
    assert read_state(killed, manifest).step == 2
    resumed = device.train(exported, examples, epochs=2, state_path=killed, resume=True)
    assert resumed.step == whole.step == 6 and len(resumed.losses) == 4
    assert resumed.losses == whole.losses[2:]
    a, b = read_state(whole.state_path, manifest), read_state(killed, manifest)
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]) and torch.equal(a.momentum[name], b.momentum[name])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("roberta", "cannot export a 'roberta' model"),
        ("plain", "not reconfigured by FAR"),
        ("heads", "attention heads are split"),
        ("length", "position"),
    ],
)
def test_what_cannot_be_exported_is_refused_before_anything_is_written(tokenizer, tmp_path, case, message):
    if case == "roberta":
        model = far.reconfigure(tiny_model("roberta"), CONFIG)
    elif case == "plain":
        model = stock(tokenizer)
    elif case == "heads":
        model = far.reconfigure(stock(tokenizer), retention=0.25, selection="random", attention_retention=0.5)
    else:
        model = far.reconfigure(stock(tokenizer), CONFIG)
    length = 33 if case == "length" else LENGTH
    with pytest.raises(ValueError, match=message):
        device.export_executorch(
            model, tokenizer, tmp_path / "out", batch_size=BATCH, max_length=length, lr=LR, momentum=MOMENTUM
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.device
def test_examples_longer_than_the_program_are_refused_or_cut(exported, tokenizer, tmp_path):
    long = ["a very long review " * 10, "short"]
    with pytest.raises(ValueError, match=r"1 example\(s\) exceed the program's max_length of 16 tokens: 0 \("):
        device.write_examples(long, tokenizer, exported, tmp_path / "x.safetensors", labels=["good", 0])
    assert not (tmp_path / "x.safetensors").exists()
    path = device.write_examples(long, None, exported, tmp_path / "x.safetensors", labels=["good", 0], truncate=True)
    tensors, _ = read_examples(path, read_manifest(exported))
    assert tensors["input_ids"].shape == (2, LENGTH) and tensors["labels"].tolist() == [2, 0]
    assert tensors["attention_mask"][0].all() and not tensors["attention_mask"][1].all()


@pytest.mark.slow
@pytest.mark.device
def test_examples_from_a_csv_file(exported, tokenizer, tmp_path):
    csv = write_rows(tmp_path / "train.csv", [{"text": t, "label": y} for t, y in zip(TEXTS, LABELS, strict=True)])
    path = device.write_examples(csv, tokenizer, exported, tmp_path / "x.safetensors")
    tensors, _ = read_examples(path, read_manifest(exported))
    expected, _ = read_examples(exported / "examples.safetensors", read_manifest(exported))
    for name, value in expected.items():
        assert torch.equal(tensors[name], value), name


def test_the_batch_order_is_splitmix64_as_documented():
    def splitmix64(x: int) -> int:
        mask = (1 << 64) - 1
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    for seed, epoch, n in [(0, 0, 10), (7, 3, 25), (2**63 + 5, 1, 4)]:
        base = splitmix64(seed ^ splitmix64(epoch))
        keys = [splitmix64((base + i) & ((1 << 64) - 1)) for i in range(n)]
        assert epoch_order(seed, epoch, n).tolist() == sorted(range(n), key=lambda i: (keys[i], i))
    assert epoch_order(0, 0, 8).tolist() != epoch_order(0, 1, 8).tolist()


@pytest.mark.slow
@pytest.mark.device
def test_xnnpack_programs_take_the_same_steps(far_model, tokenizer, tmp_path):
    out = tmp_path / "out"
    device.export_executorch(
        far_model, tokenizer, out, batch_size=BATCH, max_length=LENGTH, lr=LR, momentum=MOMENTUM, xnnpack=True
    )
    manifest = read_manifest(out)
    assert manifest["programs"]["train"]["xnnpack"] == manifest["programs"]["bottom"]["xnnpack"] == "all"
    device.write_examples(TEXTS, tokenizer, out, out / "examples.safetensors", labels=LABELS)
    result = device.train(out, out / "examples.safetensors", epochs=1)
    examples, _ = read_examples(out / "examples.safetensors", manifest)
    eager, losses = eager_steps(far_model, examples, epochs=1)
    np.testing.assert_allclose(result.losses, losses, atol=1e-5)
    far.save_learners(eager, tmp_path / "eager.safetensors")
    expected = load_file(tmp_path / "eager.safetensors")
    for name, value in read_state(result.state_path, manifest).tensors.items():
        torch.testing.assert_close(value, expected[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow
@pytest.mark.device
def test_without_a_frozen_bottom_the_program_takes_token_ids(tokenizer, tmp_path):
    config = far.FARConfig(retention=0.25, selection="random")
    model = far.reconfigure(stock(tokenizer), config)
    out = tmp_path / "out"
    device.export_executorch(
        model, tokenizer, out, batch_size=BATCH, max_length=LENGTH, lr=LR, momentum=MOMENTUM, xnnpack="matmul"
    )
    manifest = read_manifest(out)
    assert not manifest["bottom"] and not (out / "bottom.pte").exists()
    assert [s["name"] for s in manifest["programs"]["train"]["inputs"]][0] == "input_ids"
    device.write_examples(TEXTS, tokenizer, out, out / "examples.safetensors", labels=LABELS)
    result = device.train(out, out / "examples.safetensors", epochs=1)
    examples, _ = read_examples(out / "examples.safetensors", manifest)
    _, losses = eager_steps(model, examples, epochs=1)
    np.testing.assert_allclose(result.losses, losses, atol=1e-5)


@pytest.mark.slow
@pytest.mark.device
def test_far_export_executorch_on_a_saved_checkpoint(tiny_model_dir, tmp_path):

    model = far.reconfigure(BertForSequenceClassification.from_pretrained(tiny_model_dir), CONFIG)
    far.save_pretrained(model, tmp_path / "run")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "run")
    out = tmp_path / "out"
    argv = ["export", "--checkpoint", str(tmp_path / "run"), "--executorch", str(out), "--xnnpack", "matmul"]
    assert main([*argv, "--batch-size", "2", "--max-length", "12"]) == 0
    programs = read_manifest(out)["programs"]
    assert (programs["train"]["xnnpack"], programs["bottom"]["xnnpack"]) == ("matmul", "all")
    assert main([*argv, "--batch-size", "2"]) == 2  # the folder holds an export already: --overwrite replaces it
    far.save_learners(model, tmp_path / "user.safetensors")
    plain = [*argv[:2], str(tiny_model_dir), "--learners", str(tmp_path / "user.safetensors"), "--xnnpack", "none"]
    assert main([*plain, "--executorch", str(tmp_path / "out2"), "--batch-size", "2", "--max-length", "12"]) == 0
    assert read_manifest(tmp_path / "out2")["base_fingerprint"] == read_manifest(out)["base_fingerprint"]


@pytest.mark.slow
@pytest.mark.device
def test_minilm_exports_and_trains_a_step(minilm_path, tmp_path):
    model, tokenizer = load_model_and_tokenizer(minilm_path, "classification", 2)
    far.reconfigure(model, far.FARConfig(retention=0.2, selection="random", freeze_embeddings=True, freeze_layers=2))
    out = tmp_path / "out"
    result = device.export_executorch(
        model, tokenizer, out, batch_size=8, max_length=32, lr=0.01, momentum=0.9, xnnpack=False
    )
    assert result.sizes["train.pte"] < result.sizes["bottom.pte"]  # the word embeddings stay in the bottom
    device.write_examples(TEXTS[:8], tokenizer, out, out / "examples.safetensors", labels=[i % 2 for i in range(8)])
    trained = device.train(out, out / "examples.safetensors", epochs=1)
    assert trained.step == 1 and len(trained.losses) == 1
    # The device's one step saw all eight examples: its loss is eager MiniLM's on them (no dropout on either side).
    examples, _ = read_examples(out / "examples.safetensors", read_manifest(out))
    with torch.no_grad():
        eager = model.eval()(**examples).loss.item()
    assert trained.losses[0] == pytest.approx(eager, abs=1e-4)


@pytest.mark.slow  # the export it reads takes 7-13 CPU s (the device tests' tier)
@FUZZ_COUNTS
@pytest.mark.device
def test_mutated_device_files_are_refused_with_device_file_error(exported, tmp_path, count):
    manifest = read_manifest(exported)
    # a state file carries a content digest, which catches nearly every change; an examples file does not, and
    # a change that leaves its ids in range is a valid file of other examples
    for name, read, share in (
        ("state.safetensors", lambda path: read_state(path, manifest), 0.9),
        ("examples.safetensors", lambda path: read_examples(path, manifest), 0.3),
    ):
        raw = (exported / name).read_bytes()
        outcome = fuzz(safetensors_mutations(raw, seed=count, count=count), tmp_path, read, (DeviceFileError,))
        assert outcome["refused"] > count * share, (name, outcome)

    folder = tmp_path / "export"
    folder.mkdir()
    for program in manifest["programs"].values():
        (folder / program["file"]).symlink_to(exported / program["file"])

    def read_folder(path: Path) -> None:
        (folder / MANIFEST).write_bytes(path.read_bytes())
        read_manifest(folder)

    # fields that no reader relies on (a dropout rate in the model's config) may hold anything
    mutated = json_mutations(manifest, seed=count, count=count)
    outcome = fuzz(mutated, tmp_path, read_folder, (DeviceFileError,))
    assert outcome["refused"] > count * 0.3, outcome


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(base_fingerprint="0" * 64), "another export"),  # another base model's export
        (lambda m: m["task"].update(num_labels=2, labels=["bad", "good"]), "another export"),  # another task
        (lambda m: m["task"].update(labels=["good", "ok", "bad"]), "other classes"),  # the same classes, renamed
    ],
    ids=["base", "task", "class-names"],
)
@pytest.mark.device
def test_device_training_refuses_an_examples_file_written_for_another_export(
    exported, tokenizer, tmp_path, change, message
):
    other = copy.deepcopy(read_manifest(exported))
    change(other)
    labels = [i % 2 for i in range(len(TEXTS))]  # class ids every one of these tasks has
    foreign = device.write_examples(TEXTS, tokenizer, other, tmp_path / "foreign.safetensors", labels=labels)
    with pytest.raises(DeviceFileError, match=message):
        device.train(exported, foreign, state_path=tmp_path / "state.safetensors")
    assert not (tmp_path / "state.safetensors").exists()
