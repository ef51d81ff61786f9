"""far.plotting: where the notebooks find data and results, and the figures they draw (on made-up inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

from far import plotting

matplotlib.use("Agg")  # no display in tests
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def labels_of(fig) -> list[tuple[str, str]]:
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes if ax.get_label() != "<colorbar>"]


def assert_labelled(fig, *in_title: str):
    for xlabel, ylabel in labels_of(fig):
        assert xlabel and ylabel
    titles = " ".join([fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes])
    for text in in_title:
        assert text in titles


@pytest.mark.parametrize(("value", "quick"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_quick_mode_reads_the_variable(monkeypatch, value, quick):
    monkeypatch.setenv(plotting.QUICK_ENV, value)
    assert plotting.quick_mode() is quick


def test_repo_root_from_the_notebooks_folder_and_elsewhere(tmp_path):
    assert plotting.repo_root(ROOT / "notebooks") == ROOT
    assert plotting.repo_root(tmp_path) == ROOT  # falls back to the checkout far was imported from


def test_relative_paths_in_the_variables_are_relative_to_the_repo(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(plotting.DATA_ENV, "experiments")
    assert plotting.data_dir() == ROOT / "experiments"
    monkeypatch.setenv(plotting.RESULTS_ENV, "notebooks")
    assert plotting.results_dir() == ROOT / "notebooks"
    monkeypatch.delenv(plotting.RESULTS_ENV)
    assert plotting.results_dir() == ROOT / "experiments" / "results"


def test_missing_data_dir_says_which_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(plotting.DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"set \$FAR_DATA_DIR"):
        plotting.data_dir()


def test_missing_result_names_the_script_that_writes_it(monkeypatch, tmp_path):
    monkeypatch.setenv(plotting.RESULTS_ENV, str(tmp_path))
    with pytest.raises(plotting.MissingResultError, match=r"experiments/replicate_far\.py --tasks sst2 .*far-r0\.1"):
        plotting.load_result("replicate_far/sweep/replication.json")
    with pytest.raises(FileNotFoundError, match="bench_memory.py"):
        plotting.load_result("bench_memory/memory_minilm.json")
    assert plotting.load_result("bench_memory/llm_memory.json", required=False) is None
    (tmp_path / "bench_memory").mkdir()
    (tmp_path / "bench_memory" / "llm_memory.json").write_text(json.dumps({"cases": {}}))
    assert plotting.load_result("bench_memory/llm_memory.json") == {"cases": {}}


def test_result_sources_are_the_commands_that_wrote_the_committed_files():
    # The notebooks print these commands as "rerun with": a stale one would send users to another experiment.
    checked = 0
    for name, command in plotting.RESULT_SOURCES.items():
        result = plotting.load_result(name)
        recorded = result.get("command") or result.get("meta", {}).get("command")
        if recorded is not None:  # the memory and LLM scripts record no command line
            assert recorded == command, name
            checked += 1
    assert checked >= 6


def test_run_setting_and_log(tmp_path):
    run = tmp_path / "runs" / "cola-full-s0"
    run.mkdir(parents=True)
    record = {"model": "minilm", "steps": 804, "hyperparameters": {"batch_size": 32, "max_length": 128, "bf16": True}}
    (run / "metrics.json").write_text(json.dumps(record))
    assert plotting.run_setting(tmp_path, "cola") == (
        "all-MiniLM-L6-v2, cola, batch 32, 804 steps, max length 128, bf16"
    )
    with pytest.raises(plotting.MissingResultError, match="no runs of sst2"):
        plotting.run_setting(tmp_path, "sst2")
    (run / "log.jsonl").write_text('{"step": 1, "loss": 0.5}\n\n{"step": 2, "loss": 0.25}\n')
    assert plotting.read_run_log(run / "log.jsonl") == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]


def test_metric_names():
    assert plotting.metric_name("cola") == "matthews_correlation"
    assert plotting.metric_name("squad") == "f1"
    with pytest.raises(ValueError, match="unknown task 'imdb'"):
        plotting.metric_name("imdb")
    assert (plotting.metric_scale("stsb"), plotting.metric_scale("squad")) == (100.0, 1.0)  # SQuAD's F1 is in points


def test_versus_full_in_points_per_task():
    row = {"metric_delta_vs_full": -0.0123, "time_saving_vs_full": 0.105, "trainable_parameters": 1234}
    squad_row = {**row, "metric_delta_vs_full": -1.5}  # SQuAD's F1 is in points already
    summary = {"cola": {"full": {"trainable_parameters": 9}, "far": row}, "squad": {"far": squad_row}}
    tail = "time saved vs full +10.5%, 1,234 parameters trained"
    assert plotting.versus_full(summary) == [
        f"  cola                  far: metric  -1.23 points vs full, {tail}",
        f" squad                  far: metric  -1.50 points vs full, {tail}",
    ]


def test_delta_share_and_running_mean():
    scores = {"layer.0": torch.tensor([8.0, 1.0, 1.0, 0.0, 0.0]), "layer.1": torch.ones(5)}
    shares = plotting.delta_share(scores, 0.4)  # top 2 of 5 nodes
    assert shares == pytest.approx({"layer.0": 0.9, "layer.1": 0.4})
    with pytest.raises(ValueError, match=r"retention must be in \(0, 1\]"):
        plotting.delta_share(scores, 0.0)
    with pytest.raises(ValueError, match="scores is empty"):
        plotting.delta_share({}, 0.4)
    assert np.allclose(plotting.running_mean([1.0, 3.0, None, 5.0], 2), [1.0, 2.0, 3.0, 5.0])
    with pytest.raises(ValueError, match="window must be at least 1"):
        plotting.running_mean([1.0], 0)


def test_node_delta_figures():
    generator = torch.Generator().manual_seed(0)
    scores = {f"encoder.layer.{i}.output.dense": torch.rand(32, generator=generator) for i in range(3)}
    fig = plotting.plot_node_deltas(scores, "tiny, CoLA, 4 steps")
    assert_labelled(fig, "tiny, CoLA, 4 steps", "layer × node")
    fig = plotting.plot_concentration(scores, 0.4, "tiny concentration")
    assert_labelled(fig, "tiny concentration")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][:3] == ["layer 0", "layer 1", "layer 2"]


def _stats(mean: float, std: float, values: list[float]) -> dict:
    return {"mean": mean, "std": std, "n": len(values), "values": values}


def test_method_and_sweep_figures():
    summary = {
        method: {"metric": _stats(m, 0.01, [m - 0.01, m + 0.01]), "train_seconds": _stats(t, 1.0, [t - 1, t + 1])}
        for method, m, t in (("random", 0.3, 60), ("full", 0.4, 100), ("far", 0.38, 70), ("freeze-ffn", 0.2, 50))
    }
    fig = plotting.plot_methods(summary, "cola", "setting X")
    assert_labelled(fig, "setting X")
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["full\n(n=2)", "far\n(n=2)", "random\n(n=2)", "freeze-ffn\n(n=2)"]  # the paper's order
    assert fig.axes[0].get_ylabel() == "Matthews correlation × 100 (dev, points)"
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == pytest.approx([40.0, 38.0, 30.0, 20.0])
    squad = {"full": {"metric": _stats(80.0, 1.0, [79.0, 81.0]), "train_seconds": _stats(9, 1, [8, 10])}}
    fig = plotting.plot_methods(squad, "squad", "s")
    assert [bar.get_height() for bar in fig.axes[0].patches] == [80.0]
    assert fig.axes[0].get_ylabel() == "F1 (dev, points)"
    with pytest.raises(ValueError, match="no methods for cola"):
        plotting.plot_methods({}, "cola", "x")

    sweep = {f"far-r{r}": {"metric": _stats(r / 2, 0.0, [r / 2])} for r in (0.2, 0.6, 1.0)}
    sweep["full"] = {"metric": _stats(0.5, 0.0, [0.5])}
    cell = {
        "model": "minilm", "batch": 32, "length": 64, "precision": "fp32",
        "configs": {
            "full": {"median_step_s": 0.2, "ratio_to_full": 1.0, "flop_bound_ratio": 1.0},
            **{f"far-{r}": {"median_step_s": 0.1 + r, "ratio_to_full": 0.5 + r / 2, "flop_bound_ratio": 0.6 + r / 3}
               for r in (0.2, 0.6, 1.0)},
        },
    }  # fmt: skip
    fig = plotting.plot_retention_sweep(sweep, "cola", cell, "sweep setting")
    assert_labelled(fig, "sweep setting", "batch 32 × 64 tokens, fp32")
    assert list(fig.axes[0].lines[0].get_xdata()) == [0.2, 0.6, 1.0]
    assert len(plotting.plot_retention_sweep(sweep, "cola", None, "s").axes) == 1
    with pytest.raises(ValueError, match="no far-r<R> methods"):
        plotting.plot_retention_sweep({"full": sweep["full"]}, "cola", None, "s")

    fig = plotting.plot_step_benchmark({"results": [cell, {**cell, "precision": "bf16"}, cell]})
    assert_labelled(fig, "all-MiniLM-L6-v2, batch 32 × 64 tokens, bf16")
    with pytest.raises(ValueError, match="no results"):
        plotting.plot_step_benchmark({"results": []})


def test_loss_and_memory_figures():
    log = [{"step": s, "loss": 1.0 / s, "elapsed": 0.5 * s} for s in range(1, 11)]
    log[1]["trainable_parameters"] = 10
    fig = plotting.plot_loss_curves({"a": log, "b": log[:5]}, "loss setting", window=3)
    assert_labelled(fig, "loss setting")
    with pytest.raises(ValueError, match="no runs to plot"):
        plotting.plot_loss_curves({}, "x")

    histories = {"MeZO": [{"step": 50, "accuracy": 0.6}, {"step": 100, "accuracy": 0.7}], "FAR": [{"step": 100}]}
    with pytest.raises(ValueError, match="run 'FAR' has no 'accuracy'"):
        plotting.plot_eval_history(histories, "accuracy", "x")
    histories["FAR"] = [{"step": 100, "accuracy": 0.75}]
    fig = plotting.plot_eval_history(histories, "accuracy", "history setting", baselines={"zero-shot": 0.5})
    assert_labelled(fig, "history setting")
    assert fig.axes[0].get_ylabel() == "dev accuracy"
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["MeZO", "FAR", "zero-shot"]
    with pytest.raises(ValueError, match="no runs to plot"):
        plotting.plot_eval_history({}, "accuracy", "x")
    once = {"MeZO": [{"step": 80, "accuracy": 0.48}], "FAR": [{"step": 80, "accuracy": 0.64}]}
    fig = plotting.plot_eval_history(once, "accuracy", "once", baselines={"zero-shot": 0.52})  # bars, not lines
    assert_labelled(fig, "once")
    assert [bar.get_height() for bar in fig.axes[0].patches] == [0.52, 0.48, 0.64]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["zero-shot", "MeZO\n(step 80)", "FAR\n(step 80)"]

    cases = [
        {"case": "inference", "peak_rss_bytes": 100 * 2**20, "loaded_rss_bytes": 50 * 2**20},
        {"case": "adamw", "peak_rss_bytes": 400 * 2**20, "peak_rss_runs": [390 * 2**20, 400 * 2**20, 420 * 2**20]},
    ]
    fig = plotting.plot_memory(cases, "memory setting")
    assert_labelled(fig, "memory setting", "ratio to inference")
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert notes == ["100 MiB\n×1.00", "400 MiB\n×4.00"]
    with pytest.raises(ValueError, match="no memory cases"):
        plotting.plot_memory([], "x")


def test_fewshot_figure():
    def row(k, arm, seeds):
        mean = float(np.mean(seeds))
        return {"k": k, "arm": arm, "lr": 1e-4, "dev_accuracy": seeds, "dev_mean": mean, "dev_std": 0.01}

    smol = {
        "model": "smollm2-135m",
        "zero_shot_dev_accuracy": 0.52,
        "rows": [row(16, "mezo", [0.7, 0.72]), row(16, "mezo_far", [0.6, 0.62]), row(512, "mezo", [0.7, 0.7])],
    }
    gemma = {"model": "gemma3-270m", "zero_shot_dev_accuracy": 0.54, "rows": [row(16, "mezo_far", [0.55, 0.57])]}
    fig = plotting.plot_fewshot([smol, gemma], "few-shot setting")
    assert_labelled(fig, "few-shot setting")
    ax = fig.axes[0]
    # one bar per (model, k, arm) that ran, at its mean in percent; the missing k=512 FAR row leaves a gap
    assert [round(bar.get_height(), 6) for bar in ax.patches] == [71.0, 61.0, 70.0, 56.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "SmolLM2-135M\nk = 16 per class",
        "SmolLM2-135M\nk = 512 per class",
        "Gemma-3-270M\nk = 16 per class",
    ]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["MeZO (all weights)", "MeZO + FAR (r = 0.4)"]
    with pytest.raises(ValueError, match="no few-shot rows"):
        plotting.plot_fewshot([], "x")


def test_pareto_figure_places_each_method_at_its_time_memory_and_metric():
    summary = {
        method: {
            "metric": _stats(m, 0.01, [m]),
            "train_seconds": _stats(t, 2.0, [t]),
            "peak_rss_bytes": None if rss is None else rss * 2**20,
        }
        for method, m, t, rss in (("full", 0.40, 100, 1400), ("far", 0.39, 80, 1300), ("lora", 0.30, 70, None))
    }
    fig = plotting.plot_pareto(summary, "cola", "setting P")
    assert_labelled(fig, "setting P")
    time_ax, memory_ax = fig.axes
    assert [t.get_text() for t in time_ax.texts] == ["full", "far", "lora"]
    assert [c for t in time_ax.texts for c in t.xy] == pytest.approx([100, 40.0, 80, 39.0, 70, 30.0])
    assert [c for t in memory_ax.texts for c in t.xy] == pytest.approx([1400, 40.0, 1300, 39.0])  # no peak: no point
    with pytest.raises(ValueError, match="no methods for cola"):
        plotting.plot_pareto({}, "cola", "x")
    for row, cpu in zip(summary.values(), (90, 60, 50), strict=True):
        row["process_cpu_seconds"] = _stats(cpu, 1.0, [cpu])
    fig = plotting.plot_pareto(summary, "cola", "setting P", clock="cpu")
    assert [c for t in fig.axes[0].texts for c in t.xy][::2] == pytest.approx([90, 60, 50])
    assert "CPU time" in fig.axes[0].get_xlabel()


def test_fewshot_time_figure_draws_each_arms_seed_mean_against_seconds():
    def curve(arm, seed, accuracies, step_seconds):
        return [
            {"arm": arm, "seed": seed, "seconds": i * step_seconds, "accuracy": a} for i, a in enumerate(accuracies)
        ]

    curves = [
        curve("mezo", 0, [0.5, 0.6, 0.7], 100),
        curve("mezo", 1, [0.5, 0.64, 0.74], 110),
        curve("far_top10", 0, [0.5, 0.7, 0.72, 0.75], 40),
    ]
    fig = plotting.plot_fewshot_time(curves, "time setting", target=0.72)
    assert_labelled(fig, "time setting")
    assert "training seconds" in fig.axes[0].get_xlabel()
    ax = fig.axes[0]
    mezo, far = ax.lines[0], ax.lines[1]
    np.testing.assert_allclose(mezo.get_xdata(), [0, 105, 210])
    np.testing.assert_allclose(mezo.get_ydata(), [50, 62, 72])
    np.testing.assert_allclose(far.get_ydata(), [50, 70, 72, 75])
    assert ax.lines[-1].get_ydata()[0] == pytest.approx(72)  # the target line
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == "MeZO (all weights) (2 seeds)"
    with pytest.raises(ValueError, match="no curves"):
        plotting.plot_fewshot_time([], "x")


def test_own_texts_figure_draws_perplexity_against_cpu_seconds_and_peak_rss():
    def row(arm, model, before, points, rss):
        curve = [{"cpu_seconds": s, "perplexity": p} for s, p in points]
        return {"arm": arm, "model": model, "perplexity_before": before, "perplexity": points[-1][1],
                "peak_rss_mib": rss, "curve": curve}  # fmt: skip

    rows = [
        row("adamw", "smollm2-135m", 20.0, [(0, 20.0), (100, 15.0), (200, 12.0)], 600.0),
        row("mezo", "smollm2-135m", 20.0, [(0, 20.0), (300, 19.0)], 450.0),
    ]
    fig = plotting.plot_own_texts(rows, "texts setting", rss_bars={"smollm2-135m": 640})
    left, right = fig.axes
    np.testing.assert_allclose(left.lines[0].get_xdata(), [0, 100, 200])
    np.testing.assert_allclose(left.lines[0].get_ydata(), [100, 75, 60])
    np.testing.assert_allclose(right.collections[1].get_offsets(), [[450.0, 95.0]])
    assert any(line.get_xdata()[0] == 640 for line in right.lines)  # the target
    assert "peak RSS" in right.get_xlabel() and fig._suptitle.get_text() == "texts setting"
    with pytest.raises(ValueError, match="no runs"):
        plotting.plot_own_texts([], "x")
