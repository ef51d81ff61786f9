"""Gradient priming of encoder runs: `far.finetune(priming_scores="gradient")` and its command-line flag."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_examples, tiny_model
from transformers import default_data_collator

import far
from far.cli.common import settings_from
from far.cli.main import build_parser, main
from far.selection import AUTO_FREEZE_MASS, select_learners
from far.surgery.state import learners
from far.training.batches import BatchStream
from far.training.gradient_priming import gradient_scores
from far.training.options import TrainOptions
from far.training.plan import plan_training

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def loss_of(model, batch):
    return model(**batch).loss


def batches(n: int = 3, size: int = 4) -> list[dict]:
    examples = tiny_examples(n * size)
    return [default_data_collator(examples[i * size : (i + 1) * size]) for i in range(n)]


def hand_scores(model, batches) -> dict[str, torch.Tensor]:
    """Node i of an FFN: sum over batches of sum_j |dL/dW_in[i, j]| + |dL/db_in[i]| + sum_j |dL/dW_out[j, i]|."""
    scores = {}
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        for i, layer in enumerate(model.bert.encoder.layer):
            w_in, w_out = layer.intermediate.dense, layer.output.dense  # (f, h) and (h, f)
            node = w_in.weight.grad.abs().sum(dim=1) + w_in.bias.grad.abs() + w_out.weight.grad.abs().sum(dim=0)
            name = f"bert.encoder.layer.{i}.output.dense"
            scores[name] = scores.get(name, 0) + node  # (f,)
    model.zero_grad(set_to_none=True)
    return scores


def test_encoder_gradient_scores_match_a_hand_computation_and_change_no_weight():
    model = tiny_model("bert", **NO_DROPOUT).train()
    data = batches()
    expected = hand_scores(model, data)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = gradient_scores(model, data, loss_of, checkpointing=False)
    assert got.keys() == expected.keys()
    for name in expected:  # (40,) one score per FFN node
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-7)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_gradient_priming_moves_no_weight_and_picks_the_learners_of_its_batches():
    examples = tiny_examples(24)
    model = tiny_model("bert", **NO_DROPOUT)
    stock = copy.deepcopy(model)
    config = far.FARConfig(0.25, freeze_embeddings=True)
    # keep_primed values: any weight priming moved would stay moved in the frozen nodes
    result = far.finetune(
        model, examples, config, priming=2, priming_scores="gradient", max_steps=4, batch_size=4,
        progress=False, reset_frozen=False, lr=1e-2,
    )  # fmt: skip
    assert result.priming_steps == 0  # every step trained the split model
    # The scores of the first 2 steps' batches, on the stock model, choose the same learners.
    stream = BatchStream(examples, 4, default_data_collator, 0).batches()
    first = [next(stream)[0].batch for _ in range(2)]
    expected = select_learners(config, scores=gradient_scores(stock.train(), first, loss_of, checkpointing=False))
    chosen = learners(model)
    assert {k: v.tolist() for k, v in chosen.items()} == {k: v.tolist() for k, v in expected.items()}
    assert result.learner_shares == {name: 0.25 for name in chosen}
    # Nothing moved before the surgery: the frozen nodes and the embeddings are the stock model's, bit for bit.
    far.restore(model)
    for name, nodes in chosen.items():
        layer = name.removesuffix(".output.dense")
        frozen = torch.ones(40, dtype=torch.bool)
        frozen[nodes] = False
        for suffix, rows in (("intermediate.dense.weight", frozen), ("output.dense.weight", None)):
            got, want = model.get_parameter(f"{layer}.{suffix}"), stock.get_parameter(f"{layer}.{suffix}")
            if rows is None:
                assert torch.equal(got[:, frozen], want[:, frozen])
            else:
                assert torch.equal(got[rows], want[rows])
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, stock.bert.embeddings.word_embeddings.weight)


@pytest.mark.slow
def test_gradient_priming_scores_the_depth_too():
    model = tiny_model("bert", num_hidden_layers=6, **NO_DROPOUT)  # gradient scores spread alike: `auto` freezes 1
    config = far.FARConfig(0.2, freeze_embeddings=True, freeze_layers="auto")
    result = far.finetune(
        model, tiny_examples(24), config, priming=2, priming_scores="gradient", max_steps=3, batch_size=4,
        progress=False, cache_frozen=True,
    )  # fmt: skip
    change = result.priming_layer_change
    assert len(change) == 6 and sum(change) == pytest.approx(1, abs=1e-3)
    # K is the deepest bottom stack holding under AUTO_FREEZE_MASS of the gradient scores, at least one layer left.
    below = [sum(change[:k]) for k in range(1, 6)]
    k = max((i + 1 for i, mass in enumerate(below) if mass < AUTO_FREEZE_MASS), default=0)
    assert far.summary(model, verbose=False).frozen_layers[0] == k >= 1
    shares = result.learner_shares
    assert set(shares) == {f"bert.encoder.layer.{i}.output.dense" for i in range(6)}
    assert all((shares[f"bert.encoder.layer.{i}.output.dense"] == 0) == (i < k) for i in range(6))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(priming_scores="weights"), "priming_scores must be one of 'change', 'gradient', got 'weights'"),
        (dict(priming_scores="gradient", memory_budget=2000.0), "priming_scores='change' (--priming-scores change)"),
        (dict(priming_scores="gradient", priming=0), "priming must be > 0"),
    ],
)
def test_bad_priming_scores_are_refused(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options = TrainOptions(far.FARConfig(0.2), max_steps=10, **fields)
        plan_training(100, options)


def test_gradient_priming_has_no_priming_steps_in_the_plan():
    options = TrainOptions(far.FARConfig(0.2, freeze_embeddings=True), max_steps=100, priming_scores="gradient")
    plan = plan_training(1000, options)
    assert (plan.priming_steps, plan.gradient_priming_steps, plan.priming_optimizer) == (0, 10, None)
    assert not plan.frozen_from_start  # nothing trains before the surgery
    change = plan_training(1000, TrainOptions(far.FARConfig(0.2), max_steps=100))
    assert (change.priming_steps, change.gradient_priming_steps) == (10, 0)


def test_command_line_flag_reaches_the_options():
    args = build_parser("glue").parse_args(
        ["glue", "--task", "cola", "--priming-scores", "gradient", "--priming", "16"]
    )
    settings = settings_from(args)
    assert settings.priming_scores == "gradient"
    options = settings.train_options(dict(epochs=1.0, max_steps=None, lr=None, batch_size=8, warmup=0, max_length=32))
    assert (options.priming_scores, options.priming) == ("gradient", 16)


def test_command_line_refuses_an_unknown_priming_score(capsys):
    assert main(["glue", "--task", "cola", "--priming-scores", "weights"]) == 2
    assert "argument --priming-scores: invalid choice: 'weights'" in capsys.readouterr().err


def test_the_plan_holds_the_options_whole_and_records_what_it_did():
    options = TrainOptions(far.FARConfig(0.2, freeze_embeddings=True), max_steps=100, seed=7, grad_accum=2)
    plan = plan_training(1000, options)
    assert plan.options is options
    assert (plan.seed, plan.grad_accum, plan.freeze_embeddings, plan.far) == (7, 2, True, options.config)
    record = plan.to_dict()
    assert "options" not in record and record["seed"] == 7 and record["far"]["retention"] == 0.2
    assert plan.mismatches(record) == []
    assert plan.mismatches({**record, "seed": 8}) == ["seed: saved 8, now 7"]
    with pytest.raises(AttributeError, match="no attribute 'epochs'"):
        plan.epochs  # noqa: B018 (asked for, but planning turns it into total_steps)
