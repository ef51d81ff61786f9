"""`retention="auto"`: each FFN's learner count from its own priming scores, and where the choice is recorded."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_examples, tiny_model

import far
from far.cli.common import settings_from
from far.cli.main import build_parser, main
from far.selection import AUTO_RETAIN_MASS, AUTO_RETENTION_BOUNDS, auto_retention, select_learners
from far.surgery.state import learners
from far.training.options import TrainOptions


def test_the_fewest_top_nodes_that_hold_the_share():
    # 10 of 20 total: the top two (4 + 3) hold 7 >= half, the top one (4) does not
    spread = torch.tensor([1.0, 4.0, 0.5, 3.0, 1.5] + [0.0] * 15)
    assert auto_retention({"a": spread}, mass=0.5) == {"a": 2 / 20}
    assert auto_retention({"a": spread}, mass=0.7) == {"a": 2 / 20}  # 7 of 10 exactly: still two
    assert auto_retention({"a": spread}, mass=0.71) == {"a": 3 / 20}
    assert auto_retention({"a": torch.ones(10)}, mass=0.5) == {"a": 0.5}


def test_the_retention_stays_within_its_bounds():
    low, high = AUTO_RETENTION_BOUNDS
    one_node = torch.tensor([9.0] + [0.0] * 99)  # one node holds everything: k = 1 of 100 is below the bound
    assert auto_retention({"a": one_node}) == {"a": low}
    assert auto_retention({"a": torch.ones(10)}, mass=0.95) == {"a": high}
    assert auto_retention({"a": torch.zeros(10)}) == {"a": low}  # nothing to tell the nodes apart


def test_selection_keeps_each_ffns_own_count_of_its_top_nodes():
    scores = {
        "concentrated": torch.tensor([0.0, 10.0, 0.1, 9.0, 0.2, 0.1, 0.0, 0.1, 0.0, 0.1]),
        "spread": torch.arange(1.0, 11.0),
    }
    chosen = select_learners(far.FARConfig("auto"), scores=scores)
    assert chosen["concentrated"].tolist() == [1]  # 10 of 19.6 >= half
    # 10+9+8 = 27 < 27.5, 10+9+8+7 = 34 >= 27.5: the top four
    assert chosen["spread"].tolist() == [6, 7, 8, 9]
    assert AUTO_RETAIN_MASS == 0.5  # the constant these counts assume


def test_with_depth_the_trainable_layers_keep_their_own_counts():
    scores = {f"l{i}": torch.arange(1.0, 11.0) * (i + 1) for i in range(3)}
    chosen = select_learners(far.FARConfig("auto", freeze_layers=1), scores=scores)
    assert [len(chosen[f"l{i}"]) for i in range(3)] == [0, 4, 4]  # nothing moves up from the frozen layer
    global_ = select_learners(far.FARConfig("auto", "global", freeze_layers=1), scores=scores)
    assert sum(len(v) for v in global_.values()) == 8 and len(global_["l0"]) == 0


def test_global_selection_spends_the_sum_of_the_counts_across_ffns():
    scores = {"a": torch.tensor([5.0, 5.0, 0.0, 0.0]), "b": torch.tensor([1.0, 1.0, 1.0, 1.0])}
    chosen = select_learners(far.FARConfig("auto", "global"), scores=scores)
    assert sum(len(v) for v in chosen.values()) == 1 + 2 and chosen["a"].tolist() == [0, 1]


@pytest.mark.parametrize(
    "fields,error,message",
    [
        (dict(retention="auto", selection="random"), ValueError, "which selection='random' does not read"),
        (dict(retention="half"), TypeError, "retention must be a number in (0, 1] or 'auto', got the string 'half'"),
        (dict(retention="AUTO"), TypeError, "got the string 'AUTO'"),
        (dict(retention=0.0), ValueError, "retention must be in (0, 1]"),
    ],
)
def test_bad_retentions_are_refused(fields, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        far.FARConfig(**fields)


def test_selection_without_scores_is_refused():
    with pytest.raises(ValueError, match="needs priming scores"):
        select_learners(far.FARConfig("auto"), n_nodes={"a": 10})


def test_memory_budget_needs_a_fixed_retention():
    with pytest.raises(ValueError, match="plans for a fixed retention"):
        TrainOptions(far.FARConfig("auto"), max_steps=10, memory_budget=2000.0)


@pytest.mark.slow
def test_reconfigure_and_finetune_record_the_chosen_retention(tmp_path):
    model = tiny_model("bert")
    result = far.finetune(
        model, tiny_examples(24), far.FARConfig("auto", freeze_embeddings=True), priming=2, max_steps=4,
        batch_size=4, progress=False,
    )  # fmt: skip
    chosen = learners(model)
    assert result.learner_shares == {name: round(len(nodes) / 40, 4) for name, nodes in chosen.items()}
    assert all(
        AUTO_RETENTION_BOUNDS[0] <= share <= AUTO_RETENTION_BOUNDS[1] for share in result.learner_shares.values()
    )
    # The learners file records the config ("auto") and the chosen nodes: a stock model takes them back.
    path = far.save_learners(model, tmp_path / "learners.safetensors")
    stock = far.load_learners(tiny_model("bert"), path)
    assert far.get_config(stock).retention == "auto"
    assert {k: v.tolist() for k, v in learners(stock).items()} == {k: v.tolist() for k, v in chosen.items()}


def test_command_line_retention_auto():
    args = build_parser("glue").parse_args(["glue", "--task", "cola", "--retention", "auto"])
    assert settings_from(args).far.retention == "auto"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--retention", "most"], "argument --retention: 'most' is neither a fraction of FFN nodes"),
        (["--method", "random", "--retention", "auto"], "which selection='random' does not read"),
    ],
)
def test_command_line_refuses_bad_retentions(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["glue", "--task", "cola", "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()
