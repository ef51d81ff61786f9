"""far.freeze_layers: the plain-freezing baseline (no surgery), and the layer discovery it shares with FAR."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, tiny_batch, tiny_model

import far
from far.freezing import below_layers, find_layers, frozen_depth

LABELS = torch.tensor([0, 1, 2])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_layers_are_found_from_the_ffns_bottom_first(arch):
    model = tiny_model(arch)
    layers = find_layers(model)
    assert len(layers) == 2 and [name.rsplit(".", 1)[1] for name in layers] == ["0", "1"]
    assert all(isinstance(model.get_submodule(name), torch.nn.Module) for name in layers)
    below = below_layers(model, layers)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    assert embeddings <= {id(model.get_parameter(n)) for n in below}
    assert not any(n.startswith(tuple(f"{layer}." for layer in layers)) for n in below)


@pytest.mark.parametrize("arch", ["bert", "llama", "gpt2"])
def test_freeze_layers_freezes_the_bottom_and_backward_stops_there(arch):
    model = tiny_model(arch).train()
    reference = [p.clone() for p in model.parameters()]
    assert far.freeze_layers(model, 1) is model
    assert not far.is_reconfigured(model)
    bottom, top = find_layers(model)
    for name, p in model.named_parameters():
        frozen = name.startswith(f"{bottom}.") or name in below_layers(model, [bottom, top])
        assert p.requires_grad is not frozen, name
    seen = []
    model.get_submodule(top).register_forward_pre_hook(
        lambda m, args, kwargs: seen.extend(t.requires_grad for t in (*args, *kwargs.values()) if torch.is_tensor(t)),
        with_kwargs=True,
    )
    model(**tiny_batch(), labels=LABELS).loss.backward()
    assert seen and not any(seen)  # nothing below layer 1 is in the graph
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    with torch.no_grad():  # only requires_grad changed
        assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters(), strict=True))


def test_k_zero_freezes_only_the_embeddings_and_what_feeds_the_layers():
    model = far.freeze_layers(tiny_model("bert"), 0)
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    assert frozen == sorted(n for n, _ in model.bert.embeddings.named_parameters(prefix="bert.embeddings"))


def test_electra_input_projection_is_frozen_too():
    model = far.freeze_layers(tiny_model("electra"), 1)  # embedding_size 24 -> hidden 32
    assert not model.electra.embeddings_project.weight.requires_grad
    assert model.classifier.dense.weight.requires_grad


def test_freezing_every_layer_is_a_linear_probe_and_summary_says_so(capsys):
    model = far.freeze_layers(tiny_model("llama"), 2)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["model.norm.weight", "score.weight"]
    far.summary(model)
    assert "frozen layers: 0-1 (2 of 2), backward stops above the layers" in capsys.readouterr().out


def test_summary_of_a_hand_frozen_layer_with_trainable_embeddings(capsys):
    model = tiny_model("bert")
    for p in model.bert.encoder.layer[0].parameters():
        p.requires_grad_(False)
    assert frozen_depth(model) == (1, 2, False)
    far.summary(model)
    assert "frozen layers: 0-0 (1 of 2), backward still runs to the bottom" in capsys.readouterr().out


@pytest.mark.parametrize(
    "k,error,message",
    [
        (True, TypeError, "k must be an int"),
        (1.0, TypeError, "k must be an int"),
        ("auto", TypeError, "k must be an int"),
        (-1, ValueError, r"k must be in \[0, 2\] \(the model has 2 layers\), got -1"),
        (3, ValueError, r"k must be in \[0, 2\]"),
    ],
)
def test_bad_k_is_refused_and_model_untouched(k, error, message):
    model = tiny_model("bert")
    with pytest.raises(error, match=message):
        far.freeze_layers(model, k)
    assert all(p.requires_grad for p in model.parameters())


def test_a_reconfigured_model_is_refused():
    model = far.reconfigure(tiny_model("bert"), 0.4, selection="random")
    before = [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match="reconfigured by FAR; let FAR freeze the layers .*freeze_layers=k"):
        far.freeze_layers(model, 1)
    assert [p.requires_grad for p in model.parameters()] == before


def test_not_a_model_is_refused():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.freeze_layers("model", 1)
