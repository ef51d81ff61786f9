"""experiments/llm_fewshot.py's pure parts: the k-shot split, the step-size grid, the pick on validation."""

import json

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def fewshot():
    return load_experiment("llm_fewshot")


def test_k_shot_split_is_k_per_class_each_and_disjoint(fewshot):
    labels = [i % 2 for i in range(200)]
    train, validation = fewshot.k_shot_split(labels, 16, seed=3)
    assert not set(train) & set(validation)
    for part in (train, validation):
        assert sorted(labels[i] for i in part) == [0] * 16 + [1] * 16
    assert fewshot.k_shot_split(labels, 16, seed=3) == (train, validation)
    assert fewshot.k_shot_split(labels, 16, seed=4) != (train, validation)


def test_grid_makes_each_step_the_asked_fraction_of_the_weights(fewshot, tmp_path):
    probes = {
        "all": {"g_rms": 50.0, "matrix_weight_rms": 0.2, "lr_for_1_percent_step": 0.01 * 0.2 / 50.0},
        "far-0.4": {"g_rms": 20.0, "matrix_weight_rms": 0.2, "lr_for_1_percent_step": 0.01 * 0.2 / 20.0},
    }
    path = tmp_path / "divergence.json"
    path.write_text(json.dumps({"probes": probes}))
    assert fewshot.scaled_grid(path, "mezo", [0.01, 0.03]) == [4e-5, 1e-4]
    # FAR's smaller g allows a 2.5x larger lr for the same step on each weight
    assert fewshot.scaled_grid(path, "mezo_far", [0.01, 0.03]) == [1e-4, 3e-4]


def test_grid_refuses_a_probe_file_without_step_sizes(fewshot, tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"probes": {"all": {"critical_lr": 1e-3}}}))
    with pytest.raises(SystemExit, match="run experiments/llm_mezo_divergence.py again"):
        fewshot.scaled_grid(path, "mezo", [0.01])
    # a step scaled by every weight's rms, norm gains included: far too large a step on Gemma-3's matrices
    path.write_text(json.dumps({"probes": {"all": {"weight_rms": 1.38, "lr_for_1_percent_step": 1e-4}}}))
    with pytest.raises(SystemExit, match="run experiments/llm_mezo_divergence.py again"):
        fewshot.scaled_grid(path, "mezo", [0.01])
    with pytest.raises(SystemExit, match="missing"):
        fewshot.scaled_grid(tmp_path / "absent.json", "mezo", [0.01])
    # no probe measures FAR with a trained embedding: its grid has to be given
    with pytest.raises(SystemExit, match="--lrs"):
        fewshot.scaled_grid(path, "mezo_far_emb", [0.01])


def test_pick_is_best_validation_accuracy_then_lowest_loss_on_seed_0(fewshot):
    def case(lr, accuracy, loss, seed=0):
        return {
            "arm": "mezo",
            "k": 16,
            "seed": seed,
            "steps": 60,
            "lr": lr,
            "validation_accuracy": accuracy,
            "validation_loss": loss,
        }

    cases = {
        "a": case(1e-5, 0.60, 0.70),
        "b": case(3e-5, 0.65, 0.69),
        "c": case(1e-4, 0.65, 0.66),  # tied accuracy: the lower validation loss wins
        "d": case(3e-4, 0.90, 0.10, seed=1),  # other seeds never pick
    }
    assert fewshot.pick_lr(cases, "mezo", 16, 60) == 1e-4
    assert fewshot.pick_lr(cases, "mezo_far", 16, 60) is None


def test_the_arm_is_ranked_on_validation_accuracy_then_seconds_never_on_dev():
    choice = load_experiment("llm_arm_choice")

    def grid(arm, lr, validation, seconds, dev, loss=0.5):
        first = {"model": "m", "k": 16, "arm": arm, "lr": lr, "step": 0}
        last = {**first, "step": 100, "validation_accuracy": validation, "validation_loss": loss}
        return f"m-k16-{arm}-seed0-lr{lr:g}-steps100", [first, {**last, "seconds": seconds, "accuracy": dev}]

    curves = dict(
        [
            grid("mezo", 1e-4, 0.75, 300.0, 0.90),  # the best dev accuracy: not what ranks
            grid("far", 1e-4, 0.8125, 330.0, 0.60),
            grid("far_top10", 1e-4, 0.8125, 120.0, 0.62),  # ties far on validation, in fewer seconds
            grid("far_top10", 3e-4, 0.5, 110.0, 0.70, loss=2.0),  # not its pick: lower validation accuracy
        ]
    )
    rows = choice.ranked_arms(curves, 100)
    assert [(r["arm"], r["rank"], r["lr"]) for r in rows] == [
        ("far_top10", 1, 1e-4),
        ("far", 2, 1e-4),
        ("mezo", 3, 1e-4),
    ]
