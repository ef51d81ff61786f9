"""docs/results.md's tables behind the rules: the retention sweep, priming's scores, the AUTO_RETAIN_MASS and
AUTO_FREEZE_MASS choices on held-out data, portable learners files."""

from __future__ import annotations

from table_sources import (
    MACHINE_A,
    MIB,
    TASK_NAMES,
    constant,
    load,
    machine,
    params,
    pm,
    shares,
    signed,
    source,
    table,
)


def retention_sweep() -> str:
    sweep = load("replicate_far/sweep/replication.json")
    step = load("bench_step/bench_sweep.json")
    arms = ["0.1", "0.2", "0.4", "0.6", "0.8", "1.0"]
    accuracy = sweep["summary"]["sst2"]
    configs = step["results"][0]["configs"]
    rows = [
        ["SST-2 accuracy", *(f"{100 * accuracy[f'far-r{r}']['metric']['mean']:.2f}" for r in arms),
         f"{100 * accuracy['full']['metric']['mean']:.2f}"],
        ["step time / full's (fp32, 32 × 64)", *(f"{configs[f'far-{r}']['ratio_to_full']:.3f}" for r in arms), "1"],
        ["FLOP bound", *(f"{configs[f'far-{r}']['flop_bound_ratio']:.3f}" for r in arms), "1"],
    ]  # fmt: skip
    meta = step["meta"]
    return (
        table(["retention", *arms, "full"], rows)
        + "\n"
        + source(
            ["replicate_far/sweep/replication.json", "bench_step/bench_sweep.json"],
            f"{MACHINE_A}; the step times on {meta.get('cpu', 'machine A')}, {meta['threads']} threads",
            [sweep["command"], meta["command"]],
        )
    )


def retain_mass() -> str:
    record = load("retain_mass/sst2.json")
    chosen = constant("AUTO_RETAIN_MASS")
    rows = []
    for row in record["rows"]:
        bold = "**" if row["mass"] == chosen else ""
        cpu = row["process_cpu_seconds"][0]
        rows.append(
            [
                f"{bold}{row['mass']}{bold}",
                f"{bold}{row['held_out_metric']:.2f}{bold}",
                shares(row["learner_shares_bottom_first"][0]),
                "(not recorded)" if cpu is None else f"{cpu:.0f}",
            ]
        )
    header = [
        "AUTO_RETAIN_MASS",
        "held-out accuracy (4,000 sentences)",
        "learners per layer, bottom first",
        "process CPU s",
    ]
    return table(header, rows) + "\n" + source(["retain_mass/sst2.json"], machine(record), [record["command"]])


def freeze_mass() -> str:
    record = load("retain_mass/sst2_freeze.json")
    chosen = constant("AUTO_FREEZE_MASS")
    full = next(row for row in record["rows"] if row["mass"] is None or isinstance(row["mass"], str))
    rows = [["full fine-tuning", "—", f"{full['held_out_metric']:.2f}", "",
             " / ".join(f"{c:.1f}" for c in full["process_cpu_seconds"])]]  # fmt: skip
    for row in record["rows"]:
        if row is full:
            continue
        bold = "**" if row["mass"] == chosen else ""
        (k,) = set(row["frozen_layers"])
        rows.append(
            [
                f"{bold}{row['mass']}{bold}",
                f"{bold}{k}{bold}",
                f"{bold}{row['held_out_metric']:.2f}{bold}",
                f"{bold}{signed(row['held_out_metric'] - full['held_out_metric'])}{bold}",
                " / ".join(f"{c:.1f}" for c in row["process_cpu_seconds"]),
            ]
        )
    header = ["AUTO_FREEZE_MASS", "layers frozen (K)", "held-out accuracy, mean of 3", "vs full",
              "process CPU s (3 seeds)"]  # fmt: skip
    return table(header, rows) + "\n" + source(["retain_mass/sst2_freeze.json"], machine(record), [record["command"]])


# AUTO_RETAIN_MASS re-chosen on held-out training data of a task it was not chosen on (MRPC), and SST-2's grid
# carried above 0.5: full fine-tuning beside, 3 seeds each.
RECHOICE_FILES = ["retain_mass/mrpc.json", "retain_mass/sst2_above/sst2_above.json"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def rule_pick(candidates: list[dict], full: dict) -> float | None:
    """The rule stated before the runs: the fewest learners (smallest mass) whose held-out mean is within 1 point
    of full fine-tuning's mean on the same split; None where no candidate is."""
    passing = [row["mass"] for row in candidates if mean(row["per_seed"]) >= mean(full["per_seed"]) - 1.0]
    return min(passing, default=None)


def spread(values: list[float], digits: int = 2) -> str:
    """'mean ± std' over seeds, the mean alone for one."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    std = (sum((value - mean(values)) ** 2 for value in values) / (len(values) - 1)) ** 0.5
    return f"{mean(values):.{digits}f} ± {std:.{digits}f}"


def retain_rechoice() -> str:
    rows, records = [], []
    for relative in RECHOICE_FILES:
        record = load(relative)
        records.append(record)
        full = next(row for row in record["rows"] if row["mass"] is None)
        candidates = [row for row in record["rows"] if row is not full]
        pick = rule_pick(candidates, full)
        full_cpu = mean(full["process_cpu_seconds"])
        for row in [full, *candidates]:
            cpu = row["process_cpu_seconds"]
            cells = [
                "full fine-tuning" if row is full else f"{row['mass']:g}",
                str(len(row["per_seed"])),
                spread(row["per_seed"]),
                "" if row is full else signed(mean(row["per_seed"]) - mean(full["per_seed"])),
            ]
            if row is not full and row["mass"] == pick:
                cells = [f"**{cell}**" for cell in cells]
            differences = [a - f for a, f in zip(row["per_seed"], full["per_seed"], strict=True)]
            rows.append(
                [
                    TASK_NAMES[row["task"]][0] if row is full else "",
                    *cells,
                    "" if row is full else " ".join(signed(d, 1) for d in differences),
                    "" if row is full else shares(row["learner_shares_bottom_first"][0]),
                    " ".join(str(k) for k in row["frozen_layers"]),
                    spread(cpu, 0),
                    f"{mean(cpu) / full_cpu:.2f}",
                ]
            )
    header = ["task", "AUTO_RETAIN_MASS", "seeds", "held-out accuracy (mean ± std)", "vs full's mean",
              "vs full, seed by seed", "learners per layer, bottom first (seed 0)", "K, by seed",
              "process CPU s", "/ full's mean"]  # fmt: skip
    commands = [record["command"] for record in records]
    return table(header, rows) + "\n" + source(RECHOICE_FILES, machine(records[0]), commands)


PRIMING_COMMANDS = {
    "cola": "OMP_NUM_THREADS=1 python experiments/priming_scores.py --task cola --batches 8 16 32",
    "sst2": "OMP_NUM_THREADS=1 python experiments/priming_scores.py --task sst2 --epochs 1 --max-train-samples 8000"
    " --batches 8 16",
}
PRIMING_STSB = "OMP_NUM_THREADS=1 python experiments/priming_scores.py --task stsb --batches 8 16"


def priming_scores() -> str:
    rows, made_on = [], ""
    for task in PRIMING_COMMANDS:
        record = load(f"priming_scores/{task}.json")
        made_on = machine(record)
        change = record["change"]
        name = TASK_NAMES[task][0]
        rows.append([name, f"weight change, {record['priming_steps']} AdamW steps (the default)",
                     f"{change['cpu_seconds']:.1f}", str(change["auto_freeze_layers"]),
                     shares(change["layer_shares"]), "—"])  # fmt: skip
        for batches, gradient in record["gradient"].items():
            rows.append([name, f"gradient, {batches} batches", f"{gradient['cpu_seconds']:.1f}",
                         str(gradient["auto_freeze_layers"]), shares(gradient["layer_shares"]),
                         shares(gradient["top20_agreement_with_change"])])  # fmt: skip
    header = ["task", "priming", "CPU s", "K (`auto`, `AUTO_FREEZE_MASS` 0.4)", "layer shares, bottom first",
              "top-20% agreement with weight change, per layer"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(["priming_scores/cola.json", "priming_scores/sst2.json"], made_on, list(PRIMING_COMMANDS.values()))
    )


def portable() -> str:
    record = load("replicate_far/portable/portable.json")
    arms = record["summary"]["cola"]
    rows = []
    for method, label in (
        ("far-0.2+frozen-emb", "portable: frozen values reset to the stock model's (default)"),
        ("far-0.2+frozen-emb+keep-primed", "`--keep-primed-frozen`"),
    ):
        metric = arms[method]["metric"]
        bold = "**" if method == "far-0.2+frozen-emb" else ""
        rows.append([label, " / ".join(f"{100 * v:.2f}" for v in metric["values"]), f"{bold}{pm(metric)}{bold}",
                     f"{arms[method]['peak_rss_bytes'] / MIB:,.0f}"])  # fmt: skip
    header = ["files", "CoLA MCC, seeds 0 / 1 / 2", "mean ± std", "peak RSS MiB (max)"]
    return (
        table(header, rows)
        + "\n"
        + source(["replicate_far/portable/portable.json"], machine(record), [record["command"]])
    )


PRIMING_GRADIENT = {
    "change": ("weight change, {priming} AdamW steps (the default)", "cola-far-0.2+depth-auto+cache-s0"),
    "gradient": (
        "gradient, 16 batches (`--priming-scores gradient --priming 16`)",
        "cola-far-0.2+depth-auto+cache+gradient-16-s0",
    ),
}


def priming_gradient() -> str:
    """The whole CoLA run with each kind of priming score: its metric, cost, depth and learners."""
    rows, commands = [], []
    base_cpu = None
    for name, (label, run) in PRIMING_GRADIENT.items():
        record = load(f"priming_gradient/{name}.json")
        metrics = load(f"priming_gradient/runs/{run}/metrics.json")
        # The run's own command: the file's records a three-seed grid that was stopped after seed 0.
        commands.append(record["command"].replace("--seeds 0 1 2", "--seeds 0"))
        cpu = metrics["process_cpu_seconds"]
        base_cpu = cpu if base_cpu is None else base_cpu
        trained = [share for share in metrics["learner_shares"].values() if share > 0]
        rows.append(
            [
                label.format(priming=metrics["priming_steps"]),
                f"{100 * metrics['metrics']['matthews_correlation']:.2f}",
                f"{cpu:.0f}",
                f"{cpu / base_cpu:.2f}",
                f"{100 * metrics['priming_seconds'] / metrics['total_seconds']:.1f}%",
                str(metrics["frozen_layers"]),
                f"{sum(trained) / len(trained):.2f}",
                params(metrics["trainable_parameters"]),
                f"{metrics['peak_rss_bytes'] / MIB:,.0f}",
            ]
        )
    header = ["priming", "MCC", "process CPU s", "/ weight change's", "priming's share of the run's time", "K",
              "learners per trainable layer", "trainable params", "peak RSS MiB"]  # fmt: skip
    files = [f"priming_gradient/{name}.json" for name in PRIMING_GRADIENT]
    files += [f"priming_gradient/runs/{run}/metrics.json" for _, run in PRIMING_GRADIENT.values()]
    return table(header, rows) + "\n" + source(files, machine(load(files[0])), commands)


def auto_retention() -> str:
    """What AUTO_RETAIN_MASS chooses per layer under weight-change priming, bottom layer first."""
    rows = []
    for task in ("cola", "sst2", "stsb"):
        chosen = load(f"priming_scores/{task}.json")["change"]["auto_retention"]
        rows.append([TASK_NAMES[task][0], shares(list(chosen.values()))])
    files = [f"priming_scores/{task}.json" for task in ("cola", "sst2", "stsb")]
    return (
        table(["task", "retention chosen, bottom layer first"], rows)
        + "\n"
        + source(files, machine(load(files[0])), [*PRIMING_COMMANDS.values(), PRIMING_STSB])
    )
