from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from torch import nn

import far

EXPECTED_FIRST_FFN = {
    "bert": ("bert.encoder.layer.0.output.dense", ("bert.encoder.layer.0.intermediate.dense",)),
    "distilbert": ("distilbert.transformer.layer.0.ffn.lin2", ("distilbert.transformer.layer.0.ffn.lin1",)),
    "gpt2": ("transformer.h.0.mlp.c_proj", ("transformer.h.0.mlp.c_fc",)),
    "opt": ("model.decoder.layers.0.fc2", ("model.decoder.layers.0.fc1",)),
    "llama": ("model.layers.0.mlp.down_proj", ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")),
}


def test_every_builtin_architecture_has_one_ffn_per_layer(arch):
    ffns = far.find_ffns(tiny_model(arch))
    assert len(ffns) == 2 and all(f.n_nodes == 40 for f in ffns.values())
    if arch in EXPECTED_FIRST_FFN:
        name, inputs = EXPECTED_FIRST_FFN[arch]
        assert ffns[name].inputs == inputs


def test_find_ffns_still_works_after_reconfigure(arch):
    model = tiny_model(arch)
    before = far.find_ffns(model)
    assert far.find_ffns(far.reconfigure(model, 0.4, selection="random")) == before


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        return x + self.fc_out(torch.relu(self.fc_in(x)))


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(_Block(), _Block())

    def forward(self, x):
        return self.blocks(x)


def test_unknown_architecture_names_the_fix():
    with pytest.raises(ValueError, match=r"no built-in FFN layout for model_type None.*spec=far.FFNSpec"):
        far.find_ffns(_Custom())


def test_a_spec_makes_any_architecture_work():
    torch.manual_seed(0)
    model = _Custom()
    spec = far.FFNSpec(inputs="fc_in", output="fc_out")
    assert list(far.find_ffns(model, spec)) == ["blocks.0.fc_out", "blocks.1.fc_out"]
    x = torch.randn(4, 8)
    before = model(x)
    far.reconfigure(model, 0.5, selection="random", spec=spec)
    torch.testing.assert_close(model(x), before, atol=1e-6, rtol=0)
    far.restore(model)
    assert torch.equal(model(x), before)


def test_a_spec_that_matches_nothing_is_refused():
    with pytest.raises(ValueError, match="no FFN in _Custom matches"):
        far.find_ffns(_Custom(), far.FFNSpec(inputs=("mlp.up",), output="mlp.down"))


@pytest.mark.parametrize(
    "kwargs", [dict(inputs=(), output="o"), dict(inputs=("a",), output=""), dict(inputs=("a",), output="a")]
)
def test_bad_specs_are_refused(kwargs):
    with pytest.raises(ValueError):
        far.FFNSpec(**kwargs)


def test_mismatched_node_counts_are_refused():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc_in, self.fc_out = nn.Linear(8, 12), nn.Linear(10, 8)

    with pytest.raises(ValueError, match="different node counts"):
        far.find_ffns(Odd(), far.FFNSpec(inputs=("fc_in",), output="fc_out"))


def test_not_a_model():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        far.find_ffns(object())
