"""The notebooks' figures of one run's insides: priming's node deltas, loss curves, evaluations, memory.

The comparisons across methods are in `far.plotting.comparisons`, the causal LMs' in `far.plotting.fewshot`.

matplotlib is a dev extra: it is imported when a figure is drawn, not with this module. Every
function returns the `matplotlib.figure.Figure`; axes carry units, titles the setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

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


def pyplot():
    """matplotlib's pyplot, imported on first use (a dev extra)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # a dev extra, not a dependency of far
        raise ImportError("far.plotting draws with matplotlib: pip install matplotlib (or far[dev])") from e
    return plt


def finished(fig, title: str | None = None, **title_options):
    """`fig` titled (when `title` is given) and laid out: what every figure function returns."""
    if title is not None:
        fig.suptitle(title, **title_options)
    fig.tight_layout()
    return fig


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
    plt = pyplot()
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
    return finished(fig, title)


def plot_concentration(scores: Mapping[str, Any], retention: float, title: str):
    """Share of each layer's total L1 change carried by its top nodes, against the fraction of nodes kept."""
    plt = pyplot()
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
    return finished(fig)


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
    plt = pyplot()
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
    return finished(fig, title)


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
    plt = pyplot()
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
    return finished(fig)


def plot_memory(cases: Mapping[str, Mapping] | Sequence[Mapping], title: str, baseline: str = "inference"):
    """Peak resident memory per case (experiments/bench_memory.py), with ratios to `baseline`.

    Args:
        cases: {case: record} or a list of records with a "case" key; each has "peak_rss_bytes" and
            optionally "peak_rss_runs" (repeats: drawn as a min-max bar) and "loaded_rss_bytes" (drawn as a line).
        title: The setting (model, batch, length, steps, precision).
        baseline: The case the ratios are to.
    """
    plt = pyplot()
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
    return finished(fig)
