"""The notebooks' figures of causal LMs: few-shot accuracy, accuracy against training time, own texts' runs
(matplotlib and the figures' conventions: `far.plotting.figures`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from far.plotting.figures import CASE_LABELS, finished, pyplot
from far.plotting.results import MODEL_NAMES


def plot_fewshot(summaries: Sequence[Mapping], title: str):
    """Few-shot dev accuracy (experiments/llm_fewshot.py): per model and k, each arm's mean ± std over seeds.

    Args:
        summaries: llm_fewshot.py summaries, one per model: {"model", "zero_shot_dev_accuracy",
            "rows": [{"k", "arm", "lr", "dev_accuracy": [per seed], "dev_mean", "dev_std"}]}.
        title: The setting (steps, batch, protocol).
    """
    plt = pyplot()
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
    return finished(fig)


def plot_fewshot_time(curves: Sequence[Sequence[Mapping]], title: str, target: float | None = None):
    """Few-shot dev accuracy against training seconds (experiments/llm_fewshot_time.py): a line per arm, the
    mean over its seeds (evaluation by evaluation), the seeds' range shaded.

    Args:
        curves: Curves of one model and k, each a list of evaluations ({"arm", "seed", "seconds", "accuracy"}).
        title: The setting (model, k, clock).
        target: An accuracy to mark (plain MeZO's final mean), as a fraction.
    """
    plt = pyplot()
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
    return finished(fig)


def plot_own_texts(rows: Sequence[Mapping], title: str, rss_bars: Mapping[str, float] | None = None):
    """`far train` on a user's texts (experiments/own_texts_runs.py): held-out perplexity, as a share of the stock
    model's, against CPU seconds (left) and at the end against the whole process's peak RSS (right).

    Args:
        rows: The summary's rows: {"arm", "model", "curve": [{"cpu_seconds", "perplexity"}], "perplexity_before",
            "perplexity", "peak_rss_mib"}.
        title: The setting (corpus, batch, thread).
        rss_bars: Peak-RSS targets to mark, by model name.
    """
    plt = pyplot()
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
    return finished(fig, title, fontsize=10)
