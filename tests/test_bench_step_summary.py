"""experiments/bench_step.py's timing summary: medians, their ratio, and ratios paired round by round."""

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def bench_step():
    return load_experiment("bench_step")


def test_paired_ratios_cancel_drift_that_medians_keep(bench_step):
    # The machine runs twice as slow from round 5 on; FAR costs 0.9 of full's step in every round but
    # three, which something else on the machine disturbed (rounds 0-2).
    drift = [1.0] * 5 + [2.0] * 5
    full = list(drift)
    far = [0.9 * d for d in drift]
    far[:3] = [1.8, 1.8, 1.8]
    rows = bench_step.summarize_times({"full": full, "far-0.4": far})
    assert rows["full"]["ratio_to_full"] == 1.0 and rows["full"]["paired_ratio_median"] == 1.0
    # Medians mix slow and fast rounds: FAR's median step 1.8 s against full's 1.5 s.
    assert rows["far-0.4"]["median_step_s"] == pytest.approx(1.8)
    assert rows["far-0.4"]["ratio_to_full"] == pytest.approx(1.2)
    # Paired round by round, the drift cancels and the disturbed rounds only widen the spread.
    assert rows["far-0.4"]["paired_ratio_median"] == pytest.approx(0.9)
    assert rows["far-0.4"]["paired_ratio_q1"] == pytest.approx(0.9)
    assert rows["far-0.4"]["paired_ratio_q3"] > 1.0
    assert rows["far-0.4"]["steps"] == 10


def test_rounds_must_pair_up(bench_step):
    with pytest.raises(ValueError):
        bench_step.summarize_times({"full": [1.0, 1.0], "far-0.4": [0.9]})
