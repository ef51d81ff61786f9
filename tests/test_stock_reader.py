"""Priming without a copy of the FFNs: the stock weights read back from the model's file give the same run."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_examples, tiny_model
from safetensors.torch import load_file, save_file

import far
from far.saving.stock import stock_reader

RUN = dict(optimizer="adamw", lr=1e-2, priming=2, max_steps=5, batch_size=6, progress=False)


def saved(tmp_path, model, prefix: str = "", without: str = "") -> object:
    """`model`'s weights as a model.safetensors in `tmp_path` (keys with `prefix` removed, as a bare encoder's;
    keys starting with `without` left out, as a task head the checkpoint does not have)."""
    tensors = {
        k.removeprefix(prefix): v.contiguous()
        for k, v in model.state_dict().items()
        if not (without and k.startswith(without))
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_the_reader_finds_parameters_under_their_names_or_the_bare_encoders(tmp_path, prefix):
    model = tiny_model("bert")
    read = stock_reader(saved(tmp_path, model, prefix), model)
    name = "bert.encoder.layer.1.output.dense.weight"
    assert torch.equal(read(name), model.get_parameter(name))
    with pytest.raises(KeyError, match="not in the model files"):
        read("no.such.weight")
    assert stock_reader(tmp_path / "empty", model) is None


def test_a_primer_with_a_reference_scores_as_one_with_a_copy(tmp_path):
    model = tiny_model("bert").train()
    read = stock_reader(saved(tmp_path, model), model)
    copied = far.Primer(model)
    referenced = far.Primer(model, reference=read, embeddings=True)
    assert referenced.state() == {}  # nothing kept in memory
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**tiny_batch(), labels=torch.tensor([0, 1, 2])).loss.backward()
    optimizer.step()
    for name, score in copied.scores().items():
        assert torch.equal(referenced.scores()[name], score)
    key = "bert.encoder.layer.0.intermediate.dense.weight"
    assert torch.equal(referenced.snapshot(key), copied.snapshot(key))


def test_a_reference_that_is_not_the_model_is_refused(tmp_path):
    model = tiny_model("bert")
    folder = saved(tmp_path, model)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["bert.encoder.layer.0.output.dense.weight"] += 1e-3
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="does not hold bert.encoder.layer.0.output.dense.weight as the model has it"):
        far.Primer(model, reference=stock_reader(folder, model))


@pytest.mark.parametrize(
    "options, without",
    [({}, ""), ({"freeze_layers": 1}, ""), ({"freeze_layers": 1}, "classifier.")],
    ids=["ffn", "depth", "depth-head-not-in-file"],
)
def test_finetune_with_base_weights_ends_bit_for_bit_as_with_a_copy(tmp_path, options, without):
    # A pretrained encoder's file has no task head: the head is initialized at load time and kept as a copy.
    config = far.FARConfig(0.4, freeze_embeddings=True, **options)
    copied, referenced = tiny_model("bert"), tiny_model("bert")
    read = stock_reader(saved(tmp_path, referenced, without=without), referenced)
    far.finetune(copied, tiny_examples(), config, **RUN)
    far.finetune(referenced, tiny_examples(), config, base_weights=read, **RUN)
    for (name, a), b in zip(copied.state_dict().items(), referenced.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    path = far.save_learners(referenced.eval(), tmp_path / "user.safetensors")
    stock = tiny_model("bert").eval()
    far.load_learners(stock, path)  # frozen nodes went back to the file's values: the stock model's
    with torch.no_grad():
        assert torch.equal(stock(**tiny_batch()).logits, referenced(**tiny_batch()).logits)
