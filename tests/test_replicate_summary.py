"""experiments/replicate_far.py's summary: mean ± std over seeds and the comparison with full fine-tuning; and the
harness it runs `far` with."""

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def replicate_far():
    return load_experiment("replicate_far")


def record(metric: float, priming: float, training: float, params: int) -> dict:
    return {
        "metrics": {"matthews_correlation": metric},
        "priming_seconds": priming,
        "training_seconds": training,
        "total_seconds": priming + training + 5,
        "trainable_parameters": params,
    }


def test_summary_compares_with_full_whatever_the_order(replicate_far):
    records = {  # FAR listed before full: the deltas must still use full's mean
        ("cola", "far", 0): record(0.26, 10, 80, 18),
        ("cola", "far", 1): record(0.24, 10, 90, 18),
        ("cola", "full", 0): record(0.25, 0, 100, 22),
        ("cola", "full", 1): record(0.25, 0, 100, 22),
    }
    summary = replicate_far.summarize(records)["cola"]
    far = summary["far"]
    assert far["metric"]["mean"] == pytest.approx(0.25)
    assert far["metric"]["std"] == pytest.approx(0.0141421, rel=1e-4)
    assert far["train_seconds"]["values"] == [90, 100]  # priming counts as training time
    assert far["metric_delta_vs_full"] == pytest.approx(0.0)
    assert far["time_saving_vs_full"] == pytest.approx(0.05)
    table = replicate_far.markdown({"cola": summary})
    assert "| cola | matthews_correlation | far | 25.00 ± 1.41 | +0.00 | 95 ± 7 | 5.0% |  |  | 2 | 18 |  |  |" in table


def test_summary_marks_other_grids_times_and_shows_memory_and_kept_file(replicate_far):
    records = {
        ("cola", "full", 0): {**record(0.25, 0, 100, 22), "peak_rss_bytes": 3 * 2**30},
        ("cola", "lora", 0): {**record(0.20, 0, 60, 1), "peak_rss_bytes": 2**30},
        ("cola", "lora", 1): {**record(0.22, 0, 70, 1), "peak_rss_bytes": 2**30 + 2**20, "from_grid": "old"},
        ("cola", "far", 0): {**record(0.26, 10, 80, 18), "from_grid": "old"},
    }
    summary = replicate_far.summarize(records)
    assert summary["cola"]["lora"]["peak_rss_bytes"] == 2**30 + 2**20  # the worse of the seeds
    kept = {"lora": {"bytes": 3 * 2**19}, "full": {"bytes": 90 * 2**20}}
    table = replicate_far.markdown(summary, kept)
    assert (
        "| cola | matthews_correlation | full | 25.00 ± 0.00 | +0.00 | 100 ± 0 | 0.0% |  |  | 1 | 22 | 3,072.0 | 90.0 |"
        in table
    )
    # A row with runs of both sessions times this session's only; its seeds count both.
    assert "| lora | 21.00 ± 1.41 | -4.00 | 60 ± 0 | 40.0% |  |  | 2 | 1 | 1,025.0 | 1.5 |" in table
    # Only an earlier session's runs: their time, marked, and no saving against this session's full.
    assert "| far | 26.00 ± 0.00 | +1.00 | 90 ± 0 † |  |  |  | 1 | 18 |  |  |" in table


def test_unknown_method_fails_before_any_run(replicate_far):
    assert replicate_far.method_args("far-r0.3") == ["--method", "far", "--retention", "0.3"]
    with pytest.raises(ValueError, match="unknown method 'fast'"):
        replicate_far.method_args("fast")


def test_extra_data_tasks_read_their_own_folder_and_stay_out_of_the_default_grid(replicate_far, tmp_path, monkeypatch):
    monkeypatch.delenv(replicate_far.EXTRA_DATA_ENV, raising=False)
    assert replicate_far.task_args("cola") == ["glue", "--task", "cola"]  # the shared data, as committed
    mrpc = replicate_far.TASKS["mrpc"]["args"]
    assert replicate_far.task_args("mrpc", tmp_path) == [*mrpc, "--data-dir", str(tmp_path)]
    default = replicate_far.task_args("qnli")
    assert default[-2:] == ["--data-dir", str(replicate_far.DEFAULT_EXTRA_DATA)]
    monkeypatch.setenv(replicate_far.EXTRA_DATA_ENV, str(tmp_path))
    assert replicate_far.task_args("qnli")[-1] == str(tmp_path)
    seen = []
    monkeypatch.setattr(replicate_far, "run_one", lambda task, *args: seen.append(task) or {})
    monkeypatch.setattr(replicate_far, "write_summary", lambda *args, **kwargs: None)
    replicate_far.main(["--methods", "full", "--seeds", "0", "--output", str(tmp_path / "grid")])
    assert seen == ["cola", "sst2", "stsb", "squad"]


def test_earlier_grids_stand_in_for_missing_runs_first_folder_first(replicate_far, tmp_path):
    def write(folder: str, run: str, metric: float) -> None:
        path = tmp_path / folder / "runs" / run / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record(metric, 0, 100, 22)))

    write("a", "cola-full-s0", 0.25)
    write("b", "cola-full-s0", 0.20)
    write("b", "cola-far-s0", 0.26)
    earlier = [tmp_path / "a", tmp_path / "b"]
    runs = tmp_path / "now" / "runs"
    full = replicate_far.run_one("cola", "full", 0, runs, [], False, earlier)
    far = replicate_far.run_one("cola", "far", 0, runs, [], False, earlier)
    assert (full["metrics"]["matthews_correlation"], full["from_grid"]) == (0.25, str(tmp_path / "a"))
    assert (far["metrics"]["matthews_correlation"], far["from_grid"]) == (0.26, str(tmp_path / "b"))
    assert not runs.exists()  # nothing was run


def test_a_missing_run_runs_far_once_and_records_the_process_times(replicate_far, tmp_path, monkeypatch):
    harness = sys.modules["harness"]  # the scripts' shared module, as replicate_far imported it
    commands = []

    def fake_run(command, check, capture_output):  # stands in for the `far` process: writes its metrics.json
        commands.append(command)
        out = Path(command[command.index("--output-dir") + 1])
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps(record(0.3, 0, 10, 5)))

    monkeypatch.setattr(harness, "subprocess", SimpleNamespace(run=fake_run))
    runs = tmp_path / "runs"
    first = replicate_far.run_one("cola", "far", 0, runs, ["--bf16"], True)
    again = replicate_far.run_one("cola", "far", 0, runs, [], False)  # done: not run again
    assert len(commands) == 1 and commands[0][: len(harness.FAR)] == harness.FAR
    assert {"--bf16", "--max-steps", "--no-save-model"} <= set(commands[0])
    assert first["process_seconds"] >= 0 and "process_cpu_seconds" in first
    assert again == first == json.loads((runs / "cola-far-s0" / "metrics.json").read_text())


def test_scripts_write_under_their_own_results_folder_with_one_output_flag(replicate_far):
    harness = sys.modules["harness"]
    assert harness.results_dir(replicate_far.__file__) == harness.RESULTS / "replicate_far"
    parser = argparse.ArgumentParser()
    harness.add_output_argument(parser, harness.results_dir("x") / "x.json", "the report", aliases=("--out",))
    assert parser.parse_args([]).output == harness.RESULTS / "x" / "x.json"
    assert parser.parse_args(["--out", "a.json"]).output == Path("a.json")  # the earlier name still works
    assert "--out" not in parser.format_help().replace("--output", "")  # hidden from --help
    assert {"cpu", "cpu_flags"} <= set(harness.machine())


def test_summary_shows_whole_process_cpu_seconds_and_their_saving(replicate_far):
    records = {
        ("cola", "full", 0): {**record(0.25, 0, 100, 22), "process_cpu_seconds": 100.0},
        ("cola", "far", 0): {**record(0.25, 10, 80, 18), "process_cpu_seconds": 85.0},
        ("cola", "far", 1): {**record(0.25, 10, 80, 18), "process_cpu_seconds": 95.0},
    }
    table = replicate_far.markdown(replicate_far.summarize(records))
    assert "| 90 ± 0 | 10.0% | 90 ± 7 | 10.0% | 2 | 18 |" in table


def test_cpu_seconds_of_another_grid_stay_out_of_this_grids_row(replicate_far):
    # An earlier session's runs give the row their metric, not their CPU seconds (other cores, other threads).
    records = {
        ("cola", "full", 0): {**record(0.25, 0, 100, 22), "process_cpu_seconds": 100.0},
        ("cola", "full", 1): {**record(0.27, 0, 50, 22), "process_cpu_seconds": 40.0, "from_grid": "old"},
        ("cola", "far", 0): {**record(0.25, 10, 80, 18), "process_cpu_seconds": 60.0, "from_grid": "old"},
    }
    summary = replicate_far.summarize(records)["cola"]
    assert summary["full"]["process_cpu_seconds"]["values"] == [100.0]
    assert summary["full"]["metric"]["n"] == 2
    assert "cpu_saving_vs_full" not in summary["far"] and "time_saving_vs_full" not in summary["far"]
    assert "60 ± 0 †" in replicate_far.markdown({"cola": summary})
