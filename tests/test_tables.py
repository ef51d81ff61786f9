"""experiments/tables.py: the results tables of README.md and docs/ are what the committed result files say."""

from __future__ import annotations

import pytest
from conftest import load_experiment


@pytest.fixture(scope="module")
def tables():
    return load_experiment("tables")


def test_documents_match_the_result_files(tables):
    diffs = tables.check()
    assert not diffs, "a table differs from its result files; run python experiments/tables.py\n" + "".join(diffs)


def test_every_table_is_placed_once(tables):
    placed = []
    for path in tables.DOCUMENTS:
        placed += [match.group("name") for match in tables.MARKED.finditer(path.read_text())]
    assert sorted(placed) == sorted(tables.TABLES), "each table in TABLES sits between one pair of markers"


def test_check_reports_a_hand_edited_number(tables, tmp_path):
    readme = tmp_path / "README.md"
    text = tables.DOCUMENTS[0].read_text()
    assert "29.04 ± 2.09" in text  # CoLA, FAR's automatic configuration, grouped.json's mean ± std
    readme.write_text(text.replace("29.04 ± 2.09", "29.05 ± 2.08", 1))
    (diff,) = tables.check([readme])
    assert "-| FAR's automatic" in diff and "29.04 ± 2.09" in diff


def test_a_table_names_its_files_machine_and_command(tables):
    written = tables.TABLES["grouped"]()
    assert "Files: `experiments/results/replicate_far/grouped/grouped.json`" in written
    assert "Machine: AMD EPYC, 2 cores" in written
    assert "Command: `python experiments/replicate_far.py " in written
    # a one-seed row says so, and every row compares with full's mean over its seeds (SST-2: 84.29 - 84.02)
    assert "| FAR auto, K=2 (`AUTO_FREEZE_MASS` 0.4) | 1 | 84.29 | +0.27 | 77 | 0.76 |" in written


def test_an_unknown_marker_is_refused(tables):
    with pytest.raises(SystemExit, match="unknown table 'nope'"):
        tables.rewrite("<!-- table:nope -->\n<!-- /table:nope -->")


def test_device_metric_compares_the_device_with_the_host_without_dropout(tables, monkeypatch):
    writer = tables.device_metric
    real = writer.__globals__["load"]  # tables_llm's own reader of the result files

    def host(metric, value, precision="fp32"):
        return {"metrics": {metric: value}, "trained": {"precision": {"name": precision}}}

    fake = {
        "device_train/metric_sst2.json": {
            "command": "device_train.py --task sst2", "machine": "AMD EPYC; avx512_bf16", "cores": 2,
            "train_examples": 4000, "plan": {"total_steps": 375}, "learners_file_bytes": 15_781_756,
            "host": host("accuracy", 0.80), "device": {"metrics": {"accuracy": 0.83}},
        },
        "device_train/metric_sst2_host_no_dropout.json": {"command": "nd", "host": host("accuracy", 0.815)},
        "device_train/metric_cola.json": {
            "command": "device_train.py --task cola", "machine": "AMD EPYC; avx512_bf16", "cores": 2,
            "train_examples": 8551, "plan": {"total_steps": 804}, "host": host("matthews_correlation", 0.25),
            "device": None,
        },
        "device_train/metric_cola_host_no_dropout.json": {
            "command": "nd", "host": {"metrics": {"matthews_correlation": 0.2}},
        },
    }  # fmt: skip
    monkeypatch.setitem(writer.__globals__, "load", lambda relative: fake.get(relative) or real(relative))
    written = writer()
    assert (
        "| SST-2 (first 4,000 sentences; 872 dev) | 3 | 80.00 (fp32) | 81.50 (fp32) | **83.00** | +1.50 | 15.8 MB |"
        in written
    )
    # a device stage that did not finish, and a host file that does not record its precision, say so
    assert "| 3 | 25.00 (fp32) | 20.00 (precision not recorded) | not run |  |  |" in written
    assert "Machine: AMD EPYC, 2 cores (avx512_bf16), one thread" in written


def test_device_lowering_and_bound_add_up_what_their_files_say(tables, monkeypatch):
    real = tables.device_lowering.__globals__["load"]

    def level(name, cpu, step, loss):
        sizes = {"train.pte": 29_200_000, "bottom.pte": 61_900_000, "state.safetensors": 15_760_000,
                 "tokenizer.json": 711_661}  # fmt: skip
        export = {"cpu_s": cpu, "wall_s": 2 * cpu, "peak_rss_MiB": 1500, "sizes_bytes": sizes,
                  "planned_bytes": {"train": 500e6}, "load_average": 3.0}  # fmt: skip
        runs = {"runner": [{"last_loss": loss}]}
        return {"xnnpack": name, "export": export, "runner_step_cpu_s": step, "eager_step_cpu_s": 1,
                "runner_over_eager": step, "runner_peak_rss_MiB": 900, "load_average": 4.0, "runs": runs}  # fmt: skip

    machine = {"command": "device_train.py --part x", "machine": "AMD EPYC; avx512_bf16", "cores": 2}
    fake = {
        "device_train/lowering.json": {
            **machine, "steps": 4,
            "rows": [level("none", 20, 2.5, 0.69), level("matmul", 40, 1.5, 0.69), level("all", 220, 0.5, 0.69)],
        },
        "device_train/bound.json": {
            **machine, "trainable_bytes": 2**20, "trained_layers_frozen_bytes": 2 * 2**20,
            "rows": [{"batch": 32, "saved_for_backward_bytes": 100 * 2**20},
                     {"batch": 4, "saved_for_backward_bytes": 10 * 2**20}],
        },
    }  # fmt: skip
    for writer in (tables.device_lowering, tables.device_bound):
        monkeypatch.setitem(writer.__globals__, "load", lambda relative: fake.get(relative) or real(relative))
    lowering = tables.device_lowering()
    row = "| `all`: every operator XNNPACK takes, op by op | 220 (440) | 1500 MiB | 29.2 MB | 500 MB | 0.50 | 1.00 |"
    assert row in lowering
    # 200 CPU s more to export, 2 s saved a step: it pays from 100 steps
    assert "`all` costs 200 CPU s more to export than `none` and saves 2.00 CPU s a step" in lowering
    assert "it pays from about 100 steps" in lowering
    bound = tables.device_bound()
    # one pass: saved + frozen + AdamW's 4 copies; micro-batches add their gradient sum
    assert "| 32 (one pass) | 100.0 | 2.0 | 4.0 |  | **106.0** |" in bound
    assert "| 4 (8 micro-batches) | 10.0 | 2.0 | 4.0 | 1.0 | **17.0** |" in bound
