"""experiments/lr_sweep.py's choice of a rate per method, on held-out training data."""

import json
import sys

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def lr_sweep():
    return load_experiment("lr_sweep")


def run(accuracy: float | None, final_loss: float) -> dict:
    return {
        "metrics": {"accuracy": accuracy},
        "priming_seconds": 1.0,
        "training_seconds": 9.0,
        "final_loss": final_loss,
    }


def test_best_rate_is_the_best_held_out_metric_then_the_lower_loss(lr_sweep):
    records = {
        ("full", 5e-5): run(0.80, 0.40),
        ("full", 1e-4): run(0.84, 0.35),
        ("full", 2e-4): run(0.82, 0.30),  # a lower loss does not beat a better held-out metric
        ("lora", 1e-3): run(0.50, 0.69),
        ("lora", 2e-3): run(0.50, 0.60),  # tied metric: the lower training loss wins
        ("lora", 4e-3): run(None, 0.10),  # no metric (e.g. a constant prediction's undefined score) ranks last
    }
    summary = lr_sweep.summarize(records, "accuracy")
    assert summary["full"]["best_lr"] == "0.0001"
    assert summary["lora"]["best_lr"] == "0.002"
    assert summary["full"]["runs"]["0.0002"] == {"metric": 0.82, "train_seconds": 10.0, "final_loss": 0.30}
    table = lr_sweep.markdown(summary, "accuracy")
    assert "| full | 0.0001 | 84.00 | 0.350 | 10 | **best** |" in table
    assert "| lora | 0.004 |  | 0.100 | 10 |  |" in table


def test_every_task_holds_out_training_data_not_the_dev_set(lr_sweep):
    for task in lr_sweep.METRICS:
        args = lr_sweep.setup(task)
        assert args[args.index("--task") + 1] == task
        assert args[args.index("--validation-from-train") + 1] == "0.2"


def test_a_finished_run_is_read_not_run_again(lr_sweep, tmp_path, monkeypatch):
    done = tmp_path / "runs" / "sst2-far-lr0.0001" / "metrics.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps(run(0.9, 0.2)))
    monkeypatch.setattr(sys.modules["harness"], "run_far", lambda *a, **k: pytest.fail("a finished run was run again"))
    assert lr_sweep.run_one("sst2", "far", 1e-4, tmp_path / "runs") == run(0.9, 0.2)
