"""The estimate before the first step: a piece of the first step timed and undone, costing the steps left."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import pad, ragged_examples, tiny_examples, tiny_model
from safetensors.torch import load_file
from test_lm_train import settings, tiny_gguf  # noqa: F401 (a fixture)

import far
from far.llm.text_runner import TextRunner
from far.recipes.own_texts import LEARNERS_FILE, TextRun, own_texts_run
from far.training.batches import BatchStream, MicroBatch
from far.training.loop import Loop
from far.training.rehearsal import steps_seconds


def _no_rehearsal(monkeypatch, runner) -> None:
    monkeypatch.setattr(runner, "rehearse", lambda self, first: None)


def _finetuned(optimizer: str) -> dict[str, torch.Tensor]:
    model = tiny_model("bert")  # dropout on: the rehearsal must leave the run's random draws as they were
    far.finetune(
        model, tiny_examples(), optimizer=optimizer, lr=1e-2, priming=2, max_steps=5, batch_size=6, progress=False,
        config=far.FARConfig(retention=0.4), group_by_length=True,
    )  # fmt: skip
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("optimizer", ["adamw", "mezo"])
def test_an_encoder_run_ends_in_the_same_weights_with_and_without_its_rehearsal(optimizer, monkeypatch, caplog):
    caplog.set_level("INFO", logger="far.training.engine")
    rehearsed = _finetuned(optimizer)
    said = [r.getMessage() for r in caplog.records if r.name == "far.training.engine"]
    assert said[0].startswith("5 steps to take: about ")
    _no_rehearsal(monkeypatch, Loop)
    plain = _finetuned(optimizer)
    assert rehearsed.keys() == plain.keys()
    for name in plain:
        assert torch.equal(rehearsed[name], plain[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "mezo"])
def test_a_text_run_ends_in_the_same_learners_with_and_without_its_rehearsal(
    tiny_gguf,  # noqa: F811
    notes,
    tmp_path,
    monkeypatch,
    optimizer,
):
    run = own_texts_run(settings(tiny_gguf, tmp_path / "a", optimizer, max_steps=3), TextRun(str(notes)))
    _no_rehearsal(monkeypatch, TextRunner)
    plain = own_texts_run(settings(tiny_gguf, tmp_path / "b", optimizer, max_steps=3), TextRun(str(notes)))
    assert run["metrics"] == plain["metrics"]
    ours, theirs = load_file(tmp_path / "a" / LEARNERS_FILE), load_file(tmp_path / "b" / LEARNERS_FILE)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_grouped_batches_are_costed_by_their_padded_tokens():
    data = ragged_examples(40)
    stream = BatchStream(data, 4, pad, seed=2, group_by_length=True)
    batches = list(itertools.islice(stream.batches(3), 7))
    # What the stream says of its batches is what it yields.
    assert stream.padded_tokens(3, 7) == [b[0].batch["input_ids"].numel() for b in batches]
    first = batches[0]
    expected = 0.5 * sum(stream.padded_tokens(3, 7)) / first[0].batch["input_ids"].numel()
    assert steps_seconds(0.5, [first], 7, stream, 3) == pytest.approx(expected)


def test_ungrouped_batches_are_costed_as_the_first_steps_pieces():
    stream = BatchStream(ragged_examples(40), 4, pad, seed=2)
    piece = MicroBatch(pad(ragged_examples(2)), 2)
    assert steps_seconds(0.5, [[piece, piece], [piece]], 10, stream, 0) == pytest.approx(0.5 * 3 * 10)
