"""docs/results.md's tables of whole GLUE runs: the replication, depth and the practitioner's baselines, one thread,
the automatic configuration side by side, grouping, bf16 by seed."""

from __future__ import annotations

import re

from table_sources import (
    MACHINE_A,
    MACHINE_B,
    MIB,
    POINTS_SCALE,
    RESULTS,
    TASK_NAMES,
    frozen_layers,
    load,
    machine,
    mcc,
    md_command,
    md_table,
    mean_std,
    params,
    pm,
    signed,
    source,
    table,
)

GROUPED_ARMS = [
    ("full", "full fine-tuning"),
    ("far-auto+depth-1+cache", "**FAR auto, K=1** (`AUTO_FREEZE_MASS` 0.25)"),
    ("far-auto+depth-auto+cache+priming-0.05", "FAR auto, K=1, priming on 5%"),
    ("far-auto+depth-auto+cache", "FAR auto, K=2 (`AUTO_FREEZE_MASS` 0.4)"),
    ("full+frozen-bottom-3+cache", "bottom 3 frozen and kept"),
    ("lora-lr2e-3", "LoRA r=8, lr 2e-3"),
    ("lora", "LoRA r=8, lr 8e-3"),
]


def grouped_grid() -> str:
    grouped = load("replicate_far/grouped/grouped.json")
    rows = []
    for task, arms in grouped["summary"].items():
        full = arms["full"]
        name, metric = TASK_NAMES[task]
        first = True
        for method, label in GROUPED_ARMS:
            if method not in arms:
                continue
            arm = arms[method]
            n = arm["metric"]["n"]
            scale = POINTS_SCALE.get(task, 100.0)
            score = pm(arm["metric"], scale) if n > 1 else f"{scale * arm['metric']['mean']:.2f}"
            if task == "squad" and method != "full":
                label += ", not grouped"
            delta = "" if method == "full" else signed(scale * (arm["metric"]["mean"] - full["metric"]["mean"]))
            cpu = arm["process_cpu_seconds"]["mean"]
            rows.append(
                [
                    f"{name}, {metric}" if first else "",
                    label,
                    str(n),
                    score,
                    delta,
                    f"{cpu:.0f}",
                    f"{cpu / full['process_cpu_seconds']['mean']:.2f}",
                    f"{arm['peak_rss_bytes'] / MIB:,.0f}",
                    f"{arm['trainable_parameters'] / 1e6:.{2 if arm['trainable_parameters'] < 1e6 else 1}f}M",
                ]
            )
            first = False
    header = [
        "task",
        "arm",
        "seeds",
        "metric (mean ± std over its seeds)",
        "vs full's mean",
        "process CPU s (mean)",
        "/ full's mean",
        "peak RSS MiB",
        "trainable",
    ]
    return (
        table(header, rows)
        + "\n"
        + source(["replicate_far/grouped/grouped.json"], machine(grouped), [grouped["command"]])
    )


NEW_TASKS = "replicate_far/new_tasks"

NEW_TASK_ARMS = [("full", "full fine-tuning"), ("far-default", "FAR's automatic configuration (`--method far`)")]


def new_tasks() -> str:
    """Full fine-tuning and `far glue --method far` alone on MRPC and QNLI, tasks no rule was chosen on."""
    grid = load(f"{NEW_TASKS}/new_tasks.json")
    rows = []
    for task, arms in grid["summary"].items():
        full = arms["full"]
        name, metric = TASK_NAMES[task]
        for method, label in NEW_TASK_ARMS:
            if method not in arms:
                continue
            arm = arms[method]
            seeds = range(arm["metric"]["n"])
            per_seed = [100 * (a - f) for a, f in zip(arm["metric"]["values"], full["metric"]["values"], strict=False)]
            runs = [load(f"{NEW_TASKS}/runs/{task}-{method}-s{seed}/metrics.json") for seed in seeds]
            others = [key for key in runs[0]["metrics"] if key != metric.lower()]  # MRPC's F1 beside accuracy
            other = ", ".join(f"{k.upper()} {100 * sum(r['metrics'][k] for r in runs) / len(runs):.2f}" for k in others)
            cpu = arm["process_cpu_seconds"]["mean"]
            rows.append(
                [
                    f"{name}, {metric}" if method == "full" else "",
                    label,
                    str(arm["metric"]["n"]),
                    pm(arm["metric"]),
                    "" if method == "full" else signed(100 * (arm["metric"]["mean"] - full["metric"]["mean"])),
                    "" if method == "full" else " ".join(signed(d, 1) for d in per_seed),
                    other,
                    " ".join(str(run["frozen_layers"]) for run in runs),
                    f"{cpu:.0f} ± {arm['process_cpu_seconds']['std']:.0f}",
                    f"{cpu / full['process_cpu_seconds']['mean']:.2f}",
                    f"{arm['peak_rss_bytes'] / MIB:,.0f}",
                    params(arm["trainable_parameters"]),
                ]
            )
    header = [
        "task",
        "arm",
        "seeds",
        "metric (mean ± std)",
        "vs full's mean",
        "vs full, seed by seed",
        "other metric (mean)",
        "frozen layers, by seed",
        "process CPU s",
        "/ full's mean",
        "peak RSS MiB",
        "trainable",
    ]
    return table(header, rows) + "\n" + source([f"{NEW_TASKS}/new_tasks.json"], machine(grid), [grid["command"]])


def seeds_cell(values: list[float], cpu: list[float], full_cpu: list[float], ratio: bool) -> str:
    """'mean ± std, CPU s (ratio to full's)' over the seeds given (the mean alone for one seed)."""
    mean = sum(values) / len(values)
    score = f"{100 * mean:.2f}"
    if len(values) > 1:
        std = (sum((value - mean) ** 2 for value in values) / (len(values) - 1)) ** 0.5
        score += f" ± {100 * std:.2f}"
    seconds = sum(cpu) / len(cpu)
    text = f"{score}, {seconds:.0f} s"
    if ratio:
        text += f" ({seconds / (sum(full_cpu) / len(full_cpu)):.2f}x)"
    return text


def grouped_vs_not() -> str:
    grouped = load("replicate_far/grouped/grouped.json")["summary"]
    ungrouped_file = load("replicate_far/ungrouped/ungrouped.json")
    ungrouped = ungrouped_file["summary"]
    rows = []
    for task in ungrouped:
        name, metric = TASK_NAMES[task]
        first = True
        for method, label in (("full", "full fine-tuning"), ("far-auto+depth-1+cache", "FAR auto, K=1")):
            on, off = grouped[task][method], ungrouped[task][method]
            seeds = off["metric"]["n"]
            on_values = on["metric"]["values"][:seeds]
            on_cpu = on["process_cpu_seconds"]["values"][:seeds]
            on_full_cpu = grouped[task]["full"]["process_cpu_seconds"]["values"][:seeds]
            off_full_cpu = ungrouped[task]["full"]["process_cpu_seconds"]["values"]

            off_values = off["metric"]["values"]
            per_seed = " / ".join(signed(100 * (a - b)) for a, b in zip(on_values, off_values, strict=True))
            rows.append(
                [
                    f"{name} {metric} ({seeds} seed{'s' if seeds > 1 else ''})" if first else "",
                    label,
                    seeds_cell(on_values, on_cpu, on_full_cpu, method != "full"),
                    seeds_cell(off_values, off["process_cpu_seconds"]["values"], off_full_cpu, method != "full"),
                    per_seed,
                ]
            )
            first = False
    header = ["task", "arm", "grouped: metric, process CPU s", "not grouped", "grouped − not, per seed"]
    grouped_file = load("replicate_far/grouped/grouped.json")
    return (
        table(header, rows)
        + "\n"
        + source(
            ["replicate_far/grouped/grouped.json", "replicate_far/ungrouped/ungrouped.json"],
            machine(grouped_file),
            [grouped_file["command"], ungrouped_file["command"]],
        )
    )


def replication() -> str:
    """The paper's Table 3 grid (machine A), with the r=0.2 frozen-embedding rows of `frozen_emb.md` (machine B)
    beside each task, their times in brackets: they ran on the other machine and do not compare."""
    main_rows = md_table("replicate_far/replication.md").splitlines()
    extra = {}
    for line in md_table("replicate_far/frozen_emb.md").splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[2] == "far-0.2+frozen-emb":
            cells[2] += " ¹"
            cells[5] = f"({cells[5]})"
            cells[6] = "(see ¹)"
            extra[cells[0]] = "| " + " | ".join(cells) + " |"
    rows = main_rows[:2]
    for number, line in enumerate(main_rows[2:], start=2):
        rows.append(line)
        task = line.strip("|").split("|")[0].strip()
        following = main_rows[number + 1] if number + 1 < len(main_rows) else ""
        if task in extra and not following.startswith(f"| {task} "):
            rows.append(extra.pop(task))
    return (
        "\n".join(rows)
        + "\n\n"
        + source(
            ["replicate_far/replication.md", "replicate_far/frozen_emb.md"],
            f"{MACHINE_A}; the ¹ rows {MACHINE_B}",
            [md_command("replicate_far/replication.md"), md_command("replicate_far/frozen_emb.md")],
        )
    )


ONE_THREAD_COLA = [
    ("one_thread_cola", "full", "full"),
    ("one_thread_cola", "full+frozen-emb", "full + frozen embeddings"),
    ("one_thread_cola", "full+frozen-bottom-2", "full, bottom 2 frozen"),
    ("one_thread_cola", "full+frozen-bottom-2+cache", "full, bottom 2 frozen, kept"),
    ("one_thread_cola_cache", "full+frozen-bottom-3+cache", "full, bottom 3 frozen, kept"),
    ("one_thread_cola", "far", "FAR r=0.4"),
    ("one_thread_cola", "far-0.2+frozen-emb", "FAR r=0.2 + frozen embeddings"),
    ("one_thread_cola", "far-0.2+frozen-emb+bottom-2", "FAR r=0.2, bottom 2 frozen"),
    ("one_thread_cola_cache", "far-0.2+frozen-emb+bottom-2+cache", "FAR r=0.2, bottom 2 frozen, kept"),
    ("one_thread_auto", "far-0.2+depth-auto+cache", "**FAR r=0.2, `--freeze-layers auto --cache-frozen`**"),
    ("one_thread_cola", "lora-lr2e-3", "LoRA r=8, lr 2e-3"),
]


def one_thread_cola() -> str:
    files = {name: load(f"replicate_far/one_thread/{name}.json") for name, _, _ in ONE_THREAD_COLA}
    full_cpu = files["one_thread_cola"]["summary"]["cola"]["full"]["process_cpu_seconds"]["mean"]
    rows = []
    for name, method, label in ONE_THREAD_COLA:
        arm = files[name]["summary"]["cola"][method]
        metric, cpu = arm["metric"], arm["process_cpu_seconds"]
        ratio = f"{cpu['mean'] / full_cpu:.2f}"
        if metric["n"] > 1:
            seeds = " / ".join(f"{100 * v:.2f}" for v in metric["values"])
            label += f" ({metric['n']} seeds: {seeds})"
            score, seconds = f"**{pm(metric)}**", f"**{cpu['mean']:.0f} ± {cpu['std']:.0f}**"
            ratio = f"**{ratio}**"
        else:
            score, seconds = f"{100 * metric['mean']:.2f}", f"{cpu['mean']:.0f}"
        rows.append([label, score, seconds, ratio, f"{arm['peak_rss_bytes'] / MIB:,.0f}",
                     params(arm["trainable_parameters"])])  # fmt: skip
    header = ["method", "MCC", "process CPU s", "/ full's", "peak RSS MiB", "trainable params"]
    names = list(dict.fromkeys(name for name, _, _ in ONE_THREAD_COLA))
    return (
        table(header, rows)
        + "\n"
        + source(
            [f"replicate_far/one_thread/{name}.json" for name in names],
            machine(files["one_thread_cola"]),
            [files[name]["command"] for name in names],
        )
    )


def one_thread_tasks() -> str:
    rows, commands, made_on = [], [], ""
    auto = ("far-0.2+depth-auto+cache", "**FAR r=0.2, `--freeze-layers auto --cache-frozen`**")
    arms = {
        "sst2": [
            ("full", "full"),
            ("full+frozen-emb", "full + frozen embeddings"),
            auto,
            ("lora", "LoRA r=8, lr 8e-3"),
        ],
        "stsb": [("full", "full"), auto],
    }
    for task, methods in arms.items():
        record = load(f"replicate_far/one_thread/one_thread_{task}.json")
        commands.append(record["command"])
        made_on = machine(record)
        summary = record["summary"][task]
        full_cpu = summary["full"]["process_cpu_seconds"]["mean"]
        for method, label in methods:
            arm = summary[method]
            cpu = arm["process_cpu_seconds"]["mean"]
            bold = "**" if label.startswith("**") else ""
            if "depth-auto" in method:
                label += f" (K={frozen_layers(f'replicate_far/one_thread/runs/{task}-{method}-s0')})"
            rows.append([TASK_NAMES[task][0], label, f"{bold}{100 * arm['metric']['mean']:.2f}{bold}",
                         f"{bold}{cpu:,.0f}{bold}", f"{bold}{cpu / full_cpu:.2f}{bold}",
                         f"{arm['peak_rss_bytes'] / MIB:,.0f}"])  # fmt: skip
    header = ["task", "method", "metric", "process CPU s", "/ full's", "peak RSS MiB"]
    files = [f"replicate_far/one_thread/one_thread_{task}.json" for task in arms]
    return table(header, rows) + "\n" + source(files, made_on, commands)


def practitioner() -> str:
    grid = load("replicate_far/practitioner/practitioner.json")
    extra = load("replicate_far/practitioner/practitioner_far.json")
    arms = grid["summary"]["cola"]
    full = arms["full"]
    labelled = [
        (arms["full"], "full"),
        (arms["full+frozen-emb"], "full + frozen embeddings"),
        (arms["full+frozen-bottom-3"], "full, embeddings + bottom 3 layers frozen"),
        (arms["far"], "FAR r=0.4"),
        (arms["lora"], "LoRA r=8, lr 8e-3"),
        (extra["summary"]["cola"]["far-0.2+depth-auto"],
         "FAR r=0.2 + frozen emb., `--freeze-layers auto` (`AUTO_FREEZE_MASS` 0.4; `practitioner_far.json`)"),
    ]  # fmt: skip
    rows = []
    for arm, label in labelled:
        metric, cpu = arm["metric"], arm["process_cpu_seconds"]
        many = metric["n"] > 1
        saved = 1 - cpu["mean"] / full["process_cpu_seconds"]["mean"]
        rows.append([label, str(metric["n"]), pm(metric) if many else f"{100 * metric['mean']:.2f}",
                     signed(100 * (metric["mean"] - full["metric"]["mean"])),
                     f"{cpu['mean']:.0f} ± {cpu['std']:.0f}" if many else f"{cpu['mean']:.0f}",
                     f"{100 * saved:.1f}%", f"{arm['peak_rss_bytes'] / MIB:,.0f}"])  # fmt: skip
    header = ["method", "seeds", "CoLA MCC", "vs full's mean", "process CPU s", "CPU saved vs full's mean",
              "peak RSS MiB"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(
            ["replicate_far/practitioner/practitioner.json", "replicate_far/practitioner/practitioner_far.json"],
            machine(grid) + ", shared with other work (wall times not comparable)",
            [grid["command"], extra["command"]],
        )
    )


BF16_SEEDS = [
    ("bench_bf16/cola/fp32-s0", "bench_bf16/cola/bf16-s0", ", `--bf16`"),
    ("replicate_far/portable/runs/cola-far-0.2+frozen-emb-s1", "bench_bf16/cola/auto-s1", ""),
    ("replicate_far/portable/runs/cola-far-0.2+frozen-emb-s2", "bench_bf16/cola/auto-s2", ""),
]


def bf16_seeds() -> str:
    rows, fp32, bf16 = [], [], []
    for seed, (plain, autocast, note) in enumerate(BF16_SEEDS):
        fp32.append(mcc(plain))
        bf16.append(mcc(autocast))
        rows.append([str(seed), f"{fp32[-1]:.2f} (`{plain}`)", f"{bf16[-1]:.2f} (`{autocast}`{note})"])
    rows.append(["mean ± std", f"**{mean_std(fp32)}**", f"**{mean_std(bf16)}**"])
    return table(["seed", "fp32", "bf16 autocast"], rows)


def demo_run(seed: int, grouped: bool) -> tuple[list[float], float, bool]:
    """One `far demo` output: the three arms' dev accuracies, the whole process's CPU seconds, timing rounds on."""
    name = f"s{seed}_{'' if grouped else 'no-'}group-by-length.txt"
    text = (RESULTS / "demo_grouping" / name).read_text()
    accuracies = [float(a) for a in re.findall(r"^dev accuracy ([0-9.]+);", text, re.M)]
    user, system = re.search(r"User time \(seconds\): ([0-9.]+), System time \(seconds\): ([0-9.]+)", text).groups()
    return accuracies, float(user) + float(system), "--timing-rounds 0" not in text.splitlines()[0]


GROUP_FLAGS = ("group-by-length", "no-group-by-length --timing-rounds 0")


def demo_grouping() -> str:
    rows, sums = [], {True: [0.0] * 3, False: [0.0] * 3}
    for seed in range(3):
        cells, seconds = [str(seed)], []
        for grouped in (True, False):
            accuracies, cpu, timing = demo_run(seed, grouped)
            sums[grouped] = [a + b for a, b in zip(sums[grouped], accuracies, strict=True)]
            cells.append(" / ".join(f"{a:.4f}" for a in accuracies))
            seconds.append(f"{cpu:.1f}" + (" (with 10 timing rounds)" if timing else ""))
        rows.append([*cells, " / ".join(seconds)])
    rows.append(["mean", *(" / ".join(f"{a / 3:.4f}" for a in sums[g]) for g in (True, False)), ""])
    header = ["seed", "grouped: full / FAR auto / bottom 3 (dev accuracy)", "not grouped",
              "whole `far demo`, CPU s: grouped / not"]  # fmt: skip
    return table(header, rows) + "\n" + source(
        ["demo_grouping/"], "AMD EPYC, 2 cores (`avx512_bf16`), one thread, beside other jobs",
        [f"OMP_NUM_THREADS=1 far demo --data-dir ../shared/data --seed S --{flag}" for flag in GROUP_FLAGS],
    )  # fmt: skip


def phase_costs() -> str:
    """Where the default's process time goes, phase by phase, beside full fine-tuning's: the committed grouped runs'
    own clocks (priming, training with the kept bottom's fill inside its first epoch, evaluation) and the rest of
    the process (loading, tokenising, writing), each as a share of the process's wall time."""
    grouped = load("replicate_far/grouped/grouped.json")
    rows = []
    for task in ("cola", "sst2", "stsb"):
        name, _ = TASK_NAMES[task]
        for method, label in (("full", "full fine-tuning"), ("far-auto+depth-1+cache", "FAR's default (auto, K=1)")):
            runs = sorted((RESULTS / "replicate_far/grouped/runs").glob(f"{task}-{method}-s*/metrics.json"))
            records = [load(str(path.relative_to(RESULTS))) for path in runs]
            wall = sum(r["process_seconds"] for r in records)
            phases = {
                "priming": sum(r["priming_seconds"] for r in records),
                "training": sum(r["training_seconds"] for r in records),
                "evaluation": sum(r["eval_seconds"] for r in records),
            }
            phases["rest of the process"] = wall - sum(r["total_seconds"] for r in records)
            cpu = sum(r["process_cpu_seconds"] for r in records) / len(records)
            shares = [f"{100 * seconds / wall:.1f}%" for seconds in phases.values()]
            rows.append([name, label, str(len(records)), f"{cpu:.0f}", *shares])
    header = ["task", "arm", "seeds", "process CPU s (mean)", "priming", "training", "evaluation", "rest"]
    return (
        table(header, rows)
        + "\n"
        + source(["replicate_far/grouped/runs/*/metrics.json"], machine(grouped), [grouped["command"]])
    )
