from __future__ import annotations

from conftest import tiny_model

import far
from far.flops import step_flops


def test_full_step_is_three_forwards_of_linear_work_and_far_saves_frozen_weight_grads():
    model = tiny_model("bert")  # hidden 32, FFN 40, 2 layers, 3 labels
    linear = 2 * (4 * 32 * 32 + 2 * 32 * 40) + 32 * 32 + 32 * 3  # layers + pooler + classifier
    attention = 2 * 2 * 7 * 7 * 32 * 2  # per token-pair products, batch 1, length 7
    full = step_flops(model, batch_size=1, seq_len=7)
    assert full.forward == 2 * 7 * linear + attention
    assert full.weight_grad == 2 * 7 * linear
    assert full.input_grad == 2 * 7 * linear + 2 * attention

    far.reconfigure(model, 0.25, selection="random")  # 10 of 40 nodes per FFN learn
    split = step_flops(model, batch_size=1, seq_len=7)
    assert split.forward == full.forward and split.input_grad == full.input_grad
    assert full.weight_grad - split.weight_grad == 2 * 7 * 2 * (2 * 32 * 30)


def test_split_heads_save_the_frozen_heads_weight_grads():
    ffn_only = far.reconfigure(tiny_model("bert"), 0.25, selection="random")
    with_heads = far.reconfigure(tiny_model("bert"), 0.25, selection="random", attention_retention=0.25)
    a, b = step_flops(ffn_only, batch_size=1, seq_len=7), step_flops(with_heads, batch_size=1, seq_len=7)
    assert a.forward == b.forward and a.input_grad == b.input_grad
    # 1 of 4 heads learns: 3 frozen heads x 8 rows x 32 features in each of Q, K, V, O, in 2 layers
    assert a.weight_grad - b.weight_grad == 2 * 7 * 2 * (4 * 3 * 8 * 32)
