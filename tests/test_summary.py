from __future__ import annotations

import pytest
from conftest import tiny_model

import far


def test_summary_counts_trainable_and_learners(capsys):
    model = tiny_model("bert")
    total = sum(p.numel() for p in model.parameters())
    far.reconfigure(model, 0.25, selection="random")
    result = far.summary(model)
    frozen_per_ffn = 30 * 32 + 30 + 32 * 30  # frozen rows of W_in, their biases, frozen columns of W_out
    assert result.total_parameters == total
    assert result.trainable_parameters == total - 2 * frozen_per_ffn
    assert result.learners == {f"bert.encoder.layer.{i}.output.dense": (10, 40) for i in range(2)}
    printed = capsys.readouterr().out
    assert printed.startswith(
        f"trainable params: {result.trainable_parameters:,} || all params: {total:,} || trainable%:"
    )
    assert "10/40 learner nodes (25.0%)" in printed


@pytest.mark.parametrize(
    ("arch", "block", "heads"),
    [("bert", "bert.encoder.layer.{}.attention.output.dense", 4), ("llama", "model.layers.{}.self_attn.o_proj", 2)],
)
def test_summary_counts_split_attention_in_heads(capsys, arch, block, heads):
    # llama's tiny config has 2 key/value groups of 2 query heads: a group is the node
    model = tiny_model(arch)
    far.reconfigure(model, 0.25, attention_retention=0.5, selection="random")
    result = far.summary(model)
    for i in range(2):
        assert result.learners[block.format(i)] == (heads // 2, heads)
    assert result.attention_blocks == {block.format(i) for i in range(2)}
    printed = capsys.readouterr().out
    assert f"{heads // 2}/{heads} learner heads (50.0%)" in printed
    assert "10/40 learner nodes (25.0%)" in printed


def test_summary_of_a_plain_model_and_quiet_mode(capsys):
    result = far.summary(tiny_model("gpt2"), verbose=False)
    assert result.trainable_parameters == result.total_parameters and result.learners == {}
    assert capsys.readouterr().out == ""


def test_summary_needs_a_model():
    with pytest.raises(TypeError):
        far.summary(None)
