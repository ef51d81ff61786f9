"""The notebooks' comparisons across methods: metric and time per method, the Pareto front, retention sweeps, the
step benchmark (matplotlib and the figures' conventions: `far.plotting.figures`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from far.plotting.figures import METRIC_LABELS, finished, pyplot
from far.plotting.results import MODEL_NAMES, metric_name, metric_scale

METHOD_ORDER = ("full", "far", "random", "freeze-ffn")


def _metric_axis(task: str) -> tuple[float, str]:
    """(scale, axis label) of a task's headline metric in points."""
    name = metric_name(task)
    scale = metric_scale(task)
    return scale, f"{METRIC_LABELS.get(name, name)}{' × 100' if scale == 100 else ''} (dev, points)"


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)  # replicate_far writes NaN metrics as null


def _ordered(methods: Sequence[str]) -> list[str]:
    return [m for m in METHOD_ORDER if m in methods] + [m for m in methods if m not in METHOD_ORDER]


def plot_methods(task_summary: Mapping[str, Mapping], task: str, setting: str):
    """The Table 3 comparison for one task: metric and training time per method, mean ± std over seeds, seeds as dots.

    Args:
        task_summary: `replication.json["summary"][task]`: method -> {"metric", "train_seconds", ...}.
        task: The task (names the metric).
        setting: The runs' setting for the title (see `run_setting`).
    """
    plt = pyplot()
    if not task_summary:
        raise ValueError(f"no methods for {task}; is replication.json's summary[{task!r}] empty?")
    methods = _ordered(list(task_summary))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    panels = (("metric", *_metric_axis(task)), ("train_seconds", 1, "training wall time (s, priming + training)"))
    x = np.arange(len(methods))
    for ax, (key, scale, label) in zip(axes, panels, strict=True):
        stats = [task_summary[m][key] for m in methods]
        means = [scale * _num(s["mean"]) for s in stats]
        stds = [scale * _num(s["std"]) for s in stats]
        ax.bar(x, means, yerr=stds, capsize=5, color=[f"C{i}" for i in x], alpha=0.8)
        for i, s in enumerate(stats):
            values = [scale * v for v in s.get("values", []) if v is not None]
            ax.plot([i] * len(values), values, "k.", markersize=6, zorder=3)
        ticks = [f"{m}\n(n={task_summary[m][key]['n']})" for m in methods]
        ax.set_xticks(x, ticks, rotation=0 if len(methods) <= 4 else 30, ha="center" if len(methods) <= 4 else "right")
        ax.set(ylabel=label, xlabel="method (n = seeds; error bars: std over seeds)")
        ax.axhline(0, color="black", linewidth=0.6)
    axes[0].set_title("task metric")
    axes[1].set_title("training time")
    return finished(fig, setting)


def plot_pareto(task_summary: Mapping[str, Mapping], task: str, setting: str, clock: str = "wall"):
    """Metric against end-to-end time and against whole-process peak memory, one point per method.

    What a practitioner weighs: a method up and to the left of another beats it on both axes. Error bars
    are the std over seeds where there are several.

    Args:
        task_summary: `<replication>.json["summary"][task]`: method -> {"metric", "train_seconds",
            "process_cpu_seconds", "peak_rss_bytes", ...}.
        task: The task (names the metric).
        setting: The runs' setting for the title.
        clock: "wall" (priming + training, as `plot_methods`) or "cpu" (the whole process's CPU seconds:
            what a one-thread run takes on an unshared core, whatever else the machine ran meanwhile).
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    plt = pyplot()
    methods = _ordered([m for m in task_summary if task_summary[m].get("metric")])
    if not methods:
        raise ValueError(f"no methods for {task}; is the summary's [{task!r}] empty?")
    scale, metric_label = _metric_axis(task)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, method in enumerate(methods):
        row = task_summary[method]
        y, y_err = scale * _num(row["metric"]["mean"]), scale * _num(row["metric"]["std"])
        seconds = row["train_seconds"] if clock == "wall" else row.get("process_cpu_seconds") or {}
        rss = row.get("peak_rss_bytes")
        points = (
            (axes[0], _num(seconds.get("mean")), _num(seconds.get("std"))),
            (axes[1], _num(rss) / 2**20 if rss else None, 0),
        )
        for ax, x, x_err in points:
            if x is None or not np.isfinite(x):
                continue
            ax.errorbar(x, y, xerr=x_err, yerr=y_err, fmt="o", color=f"C{i % 10}", capsize=3, label=method)
            ax.annotate(method, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    xlabel = (
        "end-to-end training time (s, priming included)"
        if clock == "wall"
        else "whole-process CPU time (s, one thread: priming, training, evaluation)"
    )
    axes[0].set(xlabel=xlabel, ylabel=metric_label, title="metric vs time")
    axes[1].set(xlabel="whole-process peak RSS (MiB)", ylabel=metric_label, title="metric vs peak memory")
    axes[1].legend(loc="lower right", fontsize=7)
    return finished(fig, setting)


def _retention(name: str, prefix: str) -> float | None:
    try:
        return float(name.removeprefix(prefix)) if name.startswith(prefix) else None
    except ValueError:
        return None


def plot_retention_sweep(task_summary: Mapping[str, Mapping], task: str, bench_cell: Mapping | None, setting: str):
    """Metric (a replicate_far sweep, methods far-r<R>) and step time (bench_step, configs far-<R>) vs retention."""
    plt = pyplot()
    sweep = sorted((r, row) for m, row in task_summary.items() if (r := _retention(m, "far-r")) is not None)
    if not sweep:
        raise ValueError(f"no far-r<R> methods in the {task} sweep; methods are {sorted(task_summary)}")
    fig, axes = plt.subplots(1, 2 if bench_cell else 1, figsize=(12 if bench_cell else 6.5, 4), squeeze=False)
    ax = axes[0, 0]
    scale, label = _metric_axis(task)
    retentions = [r for r, _ in sweep]
    means, stds = ([scale * _num(row["metric"][k]) for _, row in sweep] for k in ("mean", "std"))
    ax.errorbar(retentions, means, yerr=stds, marker="o", capsize=4, label="FAR")
    if "full" in task_summary:
        full = scale * _num(task_summary["full"]["metric"]["mean"])
        ax.axhline(full, color="black", linestyle="--", label="full fine-tuning")
    ax.set(xlabel="retention (fraction of FFN nodes trained)", ylabel=label, title=f"{task}: dev metric vs retention")
    ax.legend()
    if bench_cell:
        ax = axes[0, 1]
        configs = bench_cell["configs"]
        points = sorted((r, row) for name, row in configs.items() if (r := _retention(name, "far-")) is not None)
        full = configs["full"]["median_step_s"] * 1000
        ax.plot([r for r, _ in points], [1000 * row["median_step_s"] for _, row in points], "o-", label="FAR, measured")
        ax.plot(
            [r for r, _ in points], [full * row["flop_bound_ratio"] for _, row in points], "s:",
            label="FAR, FLOP bound (full × FLOP ratio)",
        )  # fmt: skip
        ax.axhline(full, color="black", linestyle="--", label="full fine-tuning")
        ax.set(xlabel="retention (fraction of FFN nodes trained)", ylabel="AdamW step time (ms, median)")
        ax.set_title(
            f"step time: {MODEL_NAMES.get(bench_cell['model'], bench_cell['model'])}, batch {bench_cell['batch']} × "
            f"{bench_cell['length']} tokens, {bench_cell['precision']}"
        )
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    return finished(fig, setting)


def plot_step_benchmark(bench: Mapping):
    """bench_step.json: per (model, shape, precision) cell, each configuration's step time relative to full,
    measured and FLOP-bound."""
    plt = pyplot()
    cells = bench.get("results", [])
    if not cells:
        raise ValueError("bench_step.json has no results; re-run experiments/bench_step.py")
    cols = min(2, len(cells))
    rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax, cell in zip(axes.flat, cells, strict=False):
        names = list(cell["configs"])
        x = np.arange(len(names))
        ax.bar(x - 0.2, [cell["configs"][n]["ratio_to_full"] for n in names], 0.4, label="measured")
        ax.bar(x + 0.2, [cell["configs"][n]["flop_bound_ratio"] for n in names], 0.4, label="FLOP bound")
        ax.axhline(1, color="black", linewidth=0.8)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set(ylabel="step time / full fine-tuning's (ratio)", xlabel="configuration")
        ax.set_title(
            f"{MODEL_NAMES.get(cell['model'], cell['model'])}, batch {cell['batch']} × {cell['length']} tokens, "
            f"{cell['precision']}",
            fontsize=10,
        )
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(cells) :]:
        ax.remove()
    return finished(fig, "AdamW training step, median over timed steps (configurations interleaved in one process)")
