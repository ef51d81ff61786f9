from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import far
from far.analysis.flops import backward_reach, step_flops
from far.analysis.roofline import ACTIVATION_PASSES, ADAMW_PASSES, MMAP_THRESHOLD, Rates, step_bytes, step_seconds


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


def test_depth_cuts_input_gradients_below_the_lowest_trainable_layer():
    model = far.freeze_layers(tiny_model("bert"), 1)  # embeddings and layer 0 frozen, layer 1 trains whole
    cut = step_flops(model, batch_size=1, seq_len=7)
    flat = step_flops(model, batch_size=1, seq_len=7, depth=False)
    layer = 4 * 32 * 32 + 2 * 32 * 40
    head = 32 * 32 + 32 * 3  # pooler and classifier
    product = 2 * 7 * 7 * 32  # one (T, T) product of one layer, all heads
    assert cut.forward == flat.forward == 2 * 7 * (2 * layer + head) + 2 * 2 * product
    assert cut.weight_grad == flat.weight_grad == 2 * 7 * (layer + head)
    # No input gradient in layer 0; in layer 1, none for query, key and value (they read layer 1's input, which
    # needs no gradient), and all four of attention's backward products (its query, key and value train).
    assert cut.input_grad == 2 * 7 * (layer - 3 * 32 * 32 + head) + 4 * product
    assert flat.input_grad == 2 * 7 * (2 * layer + head) + 2 * 4 * product
    assert (cut.attention_forward, cut.attention_backward) == (2 * 2 * product, 4 * product)


def test_depth_counts_only_the_attention_products_a_trainable_query_key_or_value_needs():
    model = far.freeze_layers(tiny_model("bert"), 1)
    for name, p in model.named_parameters():  # in layer 1 only the query trains (as LoRA's q adapter would)
        if name.startswith("bert.encoder.layer.1.attention.self.") and ".query." not in name:
            p.requires_grad_(False)
    product = 2 * 7 * 7 * 32
    assert step_flops(model, batch_size=1, seq_len=7).attention_backward == 2 * product  # dP and dQ, not dK, dV


def test_trainable_embeddings_take_backward_to_the_bottom():
    full = step_flops(tiny_model("bert"), batch_size=1, seq_len=7)
    assert full == step_flops(tiny_model("bert"), batch_size=1, seq_len=7, depth=False)
    # Word embeddings frozen, the embedding LayerNorm still trains: layer 0's input still needs a gradient.
    frozen_emb = far.reconfigure(tiny_model("bert"), 0.25, selection="random", freeze_embeddings=True)
    flops = step_flops(frozen_emb, batch_size=1, seq_len=7)
    assert flops.input_grad == full.input_grad
    assert backward_reach(frozen_emb).below_trains


def test_far_with_frozen_bottom_layers_counts_like_plain_freezing_above_them():
    split = far.reconfigure(tiny_model("bert"), 0.25, selection="random", freeze_embeddings=True, freeze_layers=1)
    plain = far.freeze_layers(tiny_model("bert"), 1)
    a, b = step_flops(split, batch_size=1, seq_len=7), step_flops(plain, batch_size=1, seq_len=7)
    assert backward_reach(split).lowest == 1 and a.input_grad == b.input_grad
    # The budget (0.25 x 80 nodes) goes to layer 1, the one that trains: 20 learners, 20 frozen nodes.
    assert b.weight_grad - a.weight_grad == 2 * 7 * 2 * 32 * 20


def test_adamw_bytes_grow_with_trainable_parameters_and_trainable_embeddings():
    model = tiny_model("bert")
    full = step_bytes(model, batch_size=1, seq_len=7)
    embeddings = sum(p.numel() for p in model.bert.embeddings.parameters())
    frozen_emb = step_bytes(far.freeze_layers(tiny_model("bert"), 0), batch_size=1, seq_len=7)
    assert full.optimizer - frozen_emb.optimizer == ADAMW_PASSES * 4 * embeddings
    dense = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    assert full.gradients - frozen_emb.gradients == 4 * dense + 3 * 2 * 7 * 32 * 4  # zero-filled, tokens added
    assert full.mapped == frozen_emb.mapped == 0  # every tensor below the mmap threshold
    split = step_bytes(far.reconfigure(tiny_model("bert"), 0.25, selection="random"), batch_size=1, seq_len=7)
    frozen = 2 * 2 * 32 * 30 + 2 * 30  # per layer: 30 frozen nodes' rows and columns, and their biases
    assert full.optimizer - split.optimizer == ADAMW_PASSES * 4 * frozen
    # A (vocab, hidden) embedding above the mmap threshold is timed whole (t_embedding), in no other term.
    vocab = MMAP_THRESHOLD // (4 * 32) + 1
    big = step_bytes(tiny_model("bert", vocab_size=vocab), batch_size=1, seq_len=7)
    assert big.embedding_elements == vocab * 32 and big.mapped == 0
    assert big.optimizer == full.optimizer - ADAMW_PASSES * 4 * model.bert.embeddings.word_embeddings.weight.numel()
    assert big.gradients == full.gradients - 4 * 97 * 32 - 2 * 7 * 32 * 4  # the tiny word embedding's share


def test_tiny_bert_step_bytes_by_hand():
    model = tiny_model("bert")  # hidden 32, FFN 40, 4 heads, 2 layers, dropout 0.1
    traffic = step_bytes(model, batch_size=1, seq_len=7)
    hidden, ffn, scores = 7 * 32, 7 * 40, 4 * 7 * 7  # elements per layer
    forward, backward = ACTIVATION_PASSES["forward"], ACTIVATION_PASSES["backward"]
    per_layer = sum((forward[k] + backward[k]) * n for k, n in (("hidden", hidden), ("ffn", ffn), ("scores", scores)))
    assert traffic.activations == 4 * (2 * per_layer + 8 * hidden)
    assert traffic.dropout_elements == 2 * (2 * hidden + scores) + hidden
    params = sum(p.numel() for p in model.parameters())
    assert traffic.optimizer == ADAMW_PASSES * 4 * params and traffic.mapped == 0
    assert traffic.optimizer_tensors == len(list(model.parameters()))
    assert traffic.casts == 0
    bf16 = step_bytes(model, batch_size=1, seq_len=7, bf16=True)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert bf16.casts == 2 * 6 * weights  # cast to bf16 forward, gradient back to fp32
    # Frozen bottom layer: its backward passes go.
    frozen = step_bytes(far.freeze_layers(tiny_model("bert"), 1), batch_size=1, seq_len=7)
    assert traffic.activations - frozen.activations == 4 * sum(
        backward[k] * n for k, n in (("hidden", hidden), ("ffn", ffn), ("scores", scores))
    )


def test_roofline_seconds_are_the_sum_of_its_terms():
    model = tiny_model("bert")
    rates = Rates(1e9, 2e9, 4e9, 1e8, 1e10, 1e9, 1e7, 1e-5, 1e-9)
    total, terms = step_seconds(model, 1, 7, rates)
    flops, traffic = step_flops(model, 1, 7), step_bytes(model, 1, 7)
    assert total == pytest.approx(sum(terms.values()))
    assert terms["weight_grad_products"] == flops.weight_grad / 4e9
    assert terms["streamed_bytes"] == traffic.streamed / 1e10
    assert terms["dropout"] == traffic.dropout_elements / 1e7
    assert terms["embedding"] == traffic.embedding_elements * 1e-9
    # Freezing takes time off every term it touches, none goes up.
    _, frozen = step_seconds(far.freeze_layers(tiny_model("bert"), 1), 1, 7, rates)
    assert all(frozen[k] <= terms[k] for k in terms) and sum(frozen.values()) < total
