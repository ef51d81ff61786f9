"""The notebooks' figures: priming's node deltas, the method comparison, retention sweeps, loss curves, memory,
few-shot accuracy.

matplotlib is a dev extra: it is imported when a figure is drawn, not with this module. Every
function returns the `matplotlib.figure.Figure`; axes carry units, titles the setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from far.plotting.results import MODEL_NAMES, metric_name, metric_scale

METHOD_ORDER = ("full", "far", "random", "freeze-ffn")
METRIC_LABELS = {
    "matthews_correlation": "Matthews correlation",
    "accuracy": "accuracy",
    "pearson": "Pearson r",
    "f1": "F1",
}
CASE_LABELS = {
    "runtime": "runtime\n(no model)",
    "inference": "inference\n(no_grad)",
    "mezo": "MeZO\n(all weights)",
    "mezo_far": "MeZO + FAR\n(r = 0.4)",
    "mezo_far_emb": "MeZO + FAR\n(r = 0.4, embedding trained)",
    "far": "MeZO + FAR\n(r = 0.4, gradient priming)",
    "magnitude": "MeZO + FAR\n(r = 0.4, smallest weights)",
    "lezo": "LeZO\n(a quarter of the layers a step)",
    "magnitude_lezo": "magnitude + LeZO",
    "far_top10": "MeZO + FAR, depth\n(top third, 30% of its nodes)",
    "far_top10_full": "MeZO + FAR, depth\n(top third, all its nodes)",
    "far_top6": "MeZO + FAR, depth\n(top fifth, 50% of its nodes)",
    "far_top15": "MeZO + FAR, depth\n(top half, 40% of its nodes)",
    "adamw": "AdamW\n(all weights)",
}
MIB = 2**20


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # a dev extra, not a dependency of far
        raise ImportError("far.plotting draws with matplotlib: pip install matplotlib (or far[dev])") from e
    return plt


def _layer_label(name: str, position: int) -> str:
    numbers = re.findall(r"\d+", name)
    return f"layer {numbers[0]}" if numbers else f"FFN {position}"


def _as_arrays(scores: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not scores:
        raise ValueError("scores is empty; pass primer.scores() of a primed model")
    return {name: np.asarray(s.detach() if hasattr(s, "detach") else s, dtype=np.float64) for name, s in scores.items()}


def delta_share(scores: Mapping[str, Any], retention: float) -> dict[str, float]:
    """Per FFN: the share of its total L1 change that its top `retention` fraction of nodes carries."""
    if not 0 < retention <= 1:
        raise ValueError(f"retention must be in (0, 1], got {retention}")
    shares = {}
    for name, s in _as_arrays(scores).items():
        top = np.sort(s)[::-1][: max(1, round(retention * s.size))]
        shares[name] = float(top.sum() / s.sum()) if s.sum() > 0 else float("nan")
    return shares


def plot_node_deltas(scores: Mapping[str, Any], title: str):
    """Priming's node deltas: a histogram per layer (log scale) and a layer x node heatmap."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    arrays = _as_arrays(scores)
    fig, (hist, heat) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    positive = np.concatenate([a[a > 0] for a in arrays.values()])
    low, high = (positive.min(), positive.max()) if positive.size else (1e-12, 1.0)
    bins = np.logspace(np.log10(low), np.log10(high), 60)
    for i, (name, a) in enumerate(arrays.items()):
        hist.hist(a[a > 0], bins=bins, histtype="step", linewidth=1.4, label=_layer_label(name, i))
    hist.set(xscale="log", xlabel="node delta: L1 weight change Σ|ΔW| of the node", ylabel="nodes (count)")
    hist.set_title("distribution per layer")
    hist.legend(fontsize=8)
    matrix = np.stack([a for a in arrays.values()]) if len({a.size for a in arrays.values()}) == 1 else None
    if matrix is None:  # layers of different widths: pad on the right
        width = max(a.size for a in arrays.values())
        matrix = np.full((len(arrays), width), np.nan)
        for i, a in enumerate(arrays.values()):
            matrix[i, : a.size] = a
    image = heat.imshow(
        np.where(matrix > 0, matrix, np.nan), aspect="auto", interpolation="nearest", norm=LogNorm(low, high)
    )
    heat.set_yticks(range(len(arrays)), [_layer_label(n, i) for i, n in enumerate(arrays)])
    heat.set(xlabel="FFN node index (original order)", ylabel="transformer layer", title="layer × node")
    fig.colorbar(image, ax=heat, label="node delta Σ|ΔW| (log scale)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_concentration(scores: Mapping[str, Any], retention: float, title: str):
    """Share of each layer's total L1 change carried by its top nodes, against the fraction of nodes kept."""
    plt = _pyplot()
    arrays = _as_arrays(scores)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (name, a) in enumerate(arrays.items()):
        kept = np.arange(1, a.size + 1) / a.size
        ax.plot(kept, np.cumsum(np.sort(a)[::-1]) / a.sum(), label=_layer_label(name, i))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="every node alike")
    ax.axvline(retention, color="black", linestyle="--", linewidth=1, label=f"retention {retention}")
    ax.set(xlabel="fraction of the layer's FFN nodes kept (top by delta)", ylabel="share of the layer's total Σ|ΔW|")
    ax.set(xlim=(0, 1), ylim=(0, 1.01), title=title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


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
    plt = _pyplot()
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
    fig.suptitle(setting)
    fig.tight_layout()
    return fig


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
    plt = _pyplot()
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
    fig.suptitle(setting)
    fig.tight_layout()
    return fig


def _retention(name: str, prefix: str) -> float | None:
    try:
        return float(name.removeprefix(prefix)) if name.startswith(prefix) else None
    except ValueError:
        return None


def plot_retention_sweep(task_summary: Mapping[str, Mapping], task: str, bench_cell: Mapping | None, setting: str):
    """Metric (a replicate_far sweep, methods far-r<R>) and step time (bench_step, configs far-<R>) vs retention."""
    plt = _pyplot()
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
    fig.suptitle(setting)
    fig.tight_layout()
    return fig


def plot_step_benchmark(bench: Mapping):
    """bench_step.json: per (model, shape, precision) cell, each configuration's step time relative to full,
    measured and FLOP-bound."""
    plt = _pyplot()
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
    fig.suptitle("AdamW training step, median over timed steps (configurations interleaved in one process)")
    fig.tight_layout()
    return fig


def running_mean(values: Sequence[float | None], window: int) -> np.ndarray:
    """Trailing mean over up to `window` values (missing values skipped), same length as `values`."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    a = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    out = np.empty_like(a)
    for i in range(a.size):
        chunk = a[max(0, i + 1 - window) : i + 1]
        out[i] = np.nanmean(chunk) if np.isfinite(chunk).any() else np.nan
    return out


def plot_loss_curves(logs: Mapping[str, Sequence[Mapping]], title: str, window: int = 10):
    """Training loss of several `far.finetune` runs (their log.jsonl records) against step and wall time."""
    plt = _pyplot()
    if not logs:
        raise ValueError("no runs to plot: pass {label: read_run_log(path)}")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, (label, records) in enumerate(logs.items()):
        steps = [r["step"] for r in records]
        smooth = running_mean([r["loss"] for r in records], window)
        for ax, x in zip(axes, (steps, [r["elapsed"] for r in records]), strict=True):
            ax.plot(x, [r["loss"] for r in records], color=f"C{i}", alpha=0.2, linewidth=0.8)
            ax.plot(x, smooth, color=f"C{i}", label=label)
        switch = next((r["step"] for r in records if "trainable_parameters" in r), None)
        if switch is not None:
            axes[0].axvline(switch, color=f"C{i}", linestyle=":", linewidth=1)
    axes[0].set(xlabel="optimizer step", ylabel="training loss (cross-entropy, nats)")
    axes[1].set(xlabel="wall time (s, evaluation included)", ylabel="training loss (cross-entropy, nats)")
    axes[0].set_title(f"per step (faint: raw; solid: mean of {window}; dotted: end of priming)", fontsize=10)
    axes[1].set_title("per second of wall time", fontsize=10)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_eval_history(
    histories: Mapping[str, Sequence[Mapping]], metric: str, title: str, baselines: Mapping[str, float] | None = None
):
    """A dev metric of several runs (`FinetuneResult.history`: {"step", metric} points) against training step.

    Runs evaluated only once (at their end) are drawn as bars of that value instead, baselines included.

    Args:
        histories: {label: [{"step": s, metric: value}, ...]}.
        metric: The key to plot, e.g. "accuracy".
        title: The setting.
        baselines: {label: value} for reference (e.g. zero-shot accuracy): lines, or bars.
    """
    plt = _pyplot()
    if not histories:
        raise ValueError("no runs to plot: pass {label: result.history}")
    runs = {label: [p for p in points if p.get(metric) is not None] for label, points in histories.items()}
    empty = [label for label, points in runs.items() if not points]
    if empty:
        raise ValueError(f"run {empty[0]!r} has no {metric!r} in its history")
    baselines = dict(baselines or {})
    ylabel = f"dev {METRIC_LABELS.get(metric, metric)}"
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if all(len(points) == 1 for points in runs.values()):
        values = {**baselines, **{f"{label}\n(step {p[0]['step']})": p[0][metric] for label, p in runs.items()}}
        x = np.arange(len(values))
        ax.bar(x, list(values.values()), color=[f"C{i}" for i in x], alpha=0.85)
        for i, value in enumerate(values.values()):
            ax.annotate(f"{value:.3f}", (i, value), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(x, list(values))
        ax.set(xlabel="run (evaluated at its last step)", ylabel=ylabel, title=title)
    else:
        for i, (label, points) in enumerate(runs.items()):
            ax.plot([p["step"] for p in points], [p[metric] for p in points], "o-", color=f"C{i}", label=label)
        for j, (label, value) in enumerate(baselines.items()):
            ax.axhline(value, color="black", linestyle=("--", ":", "-.")[j % 3], linewidth=1, label=label)
        ax.set(xlabel="optimizer step", ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_memory(cases: Mapping[str, Mapping] | Sequence[Mapping], title: str, baseline: str = "inference"):
    """Peak resident memory per case (experiments/bench_memory.py), with ratios to `baseline`.

    Args:
        cases: {case: record} or a list of records with a "case" key; each has "peak_rss_bytes" and
            optionally "peak_rss_runs" (repeats: drawn as a min-max bar) and "loaded_rss_bytes" (drawn as a line).
        title: The setting (model, batch, length, steps, precision).
        baseline: The case the ratios are to.
    """
    plt = _pyplot()
    records = dict(cases) if isinstance(cases, Mapping) else {c["case"]: c for c in cases}
    if not records:
        raise ValueError("no memory cases to plot")
    names = list(records)
    peaks = np.array([records[n]["peak_rss_bytes"] / MIB for n in names])
    low = [min(records[n].get("peak_rss_runs", [records[n]["peak_rss_bytes"]])) / MIB for n in names]
    high = [max(records[n].get("peak_rss_runs", [records[n]["peak_rss_bytes"]])) / MIB for n in names]
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(names)), 4.2))
    x = np.arange(len(names))
    repeats = any("peak_rss_runs" in r for r in records.values())  # min-max bars only where there were repeats
    yerr = [peaks - low, high - peaks] if repeats else None
    ax.bar(x, peaks, yerr=yerr, capsize=5, color=[f"C{i}" for i in x], alpha=0.85)
    for i, n in enumerate(names):
        loaded = records[n].get("loaded_rss_bytes")
        if loaded:
            ax.hlines(loaded / MIB, i - 0.4, i + 0.4, color="black", linestyle="--", linewidth=1)
        if baseline in records:
            ratio = records[n]["peak_rss_bytes"] / records[baseline]["peak_rss_bytes"]
            ax.annotate(f"{peaks[i]:,.0f} MiB\n×{ratio:.2f}", (i, high[i]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [CASE_LABELS.get(n, n) for n in names])
    ax.set(ylabel="peak resident memory (MiB)", xlabel="case (one fresh process each)")
    ax.set_ylim(top=max(high) * 1.2)
    loaded_note = (
        "; dashed: after loading the model" if any(r.get("loaded_rss_bytes") for r in records.values()) else ""
    )
    ax.set_title(f"{title}\n(×: ratio to {baseline}{loaded_note})", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fewshot(summaries: Sequence[Mapping], title: str):
    """Few-shot dev accuracy (experiments/llm_fewshot.py): per model and k, each arm's mean ± std over seeds.

    Args:
        summaries: llm_fewshot.py summaries, one per model: {"model", "zero_shot_dev_accuracy",
            "rows": [{"k", "arm", "lr", "dev_accuracy": [per seed], "dev_mean", "dev_std"}]}.
        title: The setting (steps, batch, protocol).
    """
    plt = _pyplot()
    groups = [(s, k) for s in summaries for k in sorted({r["k"] for r in s["rows"]})]
    if not groups:
        raise ValueError("no few-shot rows to plot: run experiments/llm_fewshot.py --phase summary")
    arms = list(dict.fromkeys(r["arm"] for s in summaries for r in s["rows"]))
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(groups)), 4.4))
    for g, (summary, k) in enumerate(groups):
        zero = 100 * summary["zero_shot_dev_accuracy"]
        ax.hlines(zero, g - 0.45, g + 0.45, color="black", linestyle="--", linewidth=1.2)
        ax.annotate(f"zero-shot {zero:.1f}", (g - 0.45, zero), va="bottom", fontsize=7)
        for a, arm in enumerate(arms):
            row = next((r for r in summary["rows"] if r["k"] == k and r["arm"] == arm), None)
            if row is None:
                continue
            x = g - 0.4 + width * (a + 0.5)
            mean, std = 100 * row["dev_mean"], 100 * row["dev_std"]
            ax.bar(x, mean, width, yerr=std, capsize=4, color=f"C{a}", alpha=0.85, label=None if g else arm)
            ax.scatter([x] * len(row["dev_accuracy"]), [100 * v for v in row["dev_accuracy"]], color="black", s=8)
            ax.annotate(f"{mean:.1f}\nlr {row['lr']:.0e}", (x, mean + std), ha="center", va="bottom", fontsize=7)
    labels = [f"{MODEL_NAMES.get(s['model'], s['model'])}\nk = {k} per class" for s, k in groups]
    ax.set_xticks(np.arange(len(groups)), labels)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles, [CASE_LABELS.get(n, n).replace("\n", " ") for n in names], fontsize=8, loc="upper right")
    ax.set(xlabel="model, training examples per class", ylabel="SST-2 dev accuracy (%)", ylim=(40, 90))
    ax.set_title(f"{title}\n(bars: mean ± std over seeds, dots: seeds; dashed: the pretrained model)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fewshot_time(curves: Sequence[Sequence[Mapping]], title: str, target: float | None = None):
    """Few-shot dev accuracy against training seconds (experiments/llm_fewshot_time.py): a line per arm, the
    mean over its seeds (evaluation by evaluation), the seeds' range shaded.

    Args:
        curves: Curves of one model and k, each a list of evaluations ({"arm", "seed", "seconds", "accuracy"}).
        title: The setting (model, k, clock).
        target: An accuracy to mark (plain MeZO's final mean), as a fraction.
    """
    plt = _pyplot()
    if not curves:
        raise ValueError("no curves to plot: run experiments/llm_fewshot_time.py --phase curves")
    by_arm: dict[str, list[Sequence[Mapping]]] = {}
    for curve in curves:
        by_arm.setdefault(curve[0]["arm"], []).append(curve)
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for i, (arm, runs) in enumerate(by_arm.items()):
        n = min(len(c) for c in runs)
        seconds = np.array([[c[j]["seconds"] for j in range(n)] for c in runs]).mean(axis=0)
        accuracy = 100 * np.array([[c[j]["accuracy"] for j in range(n)] for c in runs])
        label = f"{CASE_LABELS.get(arm, arm)} ({len(runs)} seed{'s' * (len(runs) > 1)})".replace("\n", " ")
        ax.plot(seconds, accuracy.mean(axis=0), color=f"C{i}", label=label, linewidth=1.6)
        if len(runs) > 1:
            ax.fill_between(seconds, accuracy.min(axis=0), accuracy.max(axis=0), color=f"C{i}", alpha=0.15)
    if target is not None:
        ax.axhline(100 * target, color="black", linestyle="--", linewidth=1)
        ax.annotate("plain MeZO's final mean", (0, 100 * target), va="bottom", fontsize=7)
    ax.set(xlabel="training seconds (one CPU thread; selection and priming included)", ylabel="SST-2 dev accuracy (%)")
    ax.set_title(f"{title}\n(lines: mean over seeds; shaded: the seeds' range)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_own_texts(rows: Sequence[Mapping], title: str, rss_bars: Mapping[str, float] | None = None):
    """`far train` on a user's texts (experiments/own_texts_runs.py): held-out perplexity, as a share of the stock
    model's, against CPU seconds (left) and at the end against the whole process's peak RSS (right).

    Args:
        rows: The summary's rows: {"arm", "model", "curve": [{"cpu_seconds", "perplexity"}], "perplexity_before",
            "perplexity", "peak_rss_mib"}.
        title: The setting (corpus, batch, thread).
        rss_bars: Peak-RSS targets to mark, by model name.
    """
    plt = _pyplot()
    if not rows:
        raise ValueError("no runs to plot: run experiments/own_texts_runs.py")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, row in enumerate(rows):
        label = f"{row['arm']} ({MODEL_NAMES.get(row['model'], row['model'])})"
        before = row["perplexity_before"]
        seconds = [p["cpu_seconds"] for p in row["curve"]]
        left.plot(seconds, [100 * p["perplexity"] / before for p in row["curve"]], "o-", color=f"C{i}", label=label)
        share = 100 * row["perplexity"] / before
        right.scatter(row["peak_rss_mib"], share, color=f"C{i}", s=40)
        # Arms that end alike would print over each other: each label steps down from its point.
        offset = (4, -4 - 9 * (i % 4))
        label = f"{row['arm']}, {row['peak_rss_mib']:.0f} MiB"
        right.annotate(label, (row["peak_rss_mib"], share), xytext=offset, textcoords="offset points", fontsize=7)
    for j, (model, bar) in enumerate((rss_bars or {}).items()):
        right.axvline(bar, color="black", linestyle=("--", ":")[j % 2], linewidth=1)
        right.annotate(f"{MODEL_NAMES.get(model, model)} target", (bar, 100), rotation=90, fontsize=7, va="top")
    left.axhline(80, color="grey", linestyle=":", linewidth=1)
    left.set(xlabel="CPU seconds of training (one thread; evaluation apart)", ylabel="held-out perplexity (% of stock)")
    right.set(xlabel="whole-process peak RSS (MiB)", ylabel="final held-out perplexity (% of stock)")
    left.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
