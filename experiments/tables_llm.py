"""docs/llm.md's and docs/device.md's tables: own texts, few-shot, on the clock, memory, the device programs."""

from __future__ import annotations

import re
from collections.abc import Callable

from table_sources import MACHINE_B, MIB, RESULTS, load, machine, mean_std, rate, signed, source, table

OWN_TEXTS_ARMS = {
    "adamw": "SmolLM2-135M, **AdamW on FAR's learners** (3e-4, the default)",
    "mezo": "SmolLM2-135M, MeZO on FAR's learners (1e-4)",
    "zo-batched": "SmolLM2-135M, batched one-sided ZO, 4 directions (1e-5)",
    "mezo-plain": "SmolLM2-135M, plain MeZO, every weight (1e-6)",
    "gemma3-adamw": "Gemma-3-270M, AdamW on FAR's learners (3e-4)",
}


def own_texts() -> str:
    record = load("own_texts_runs/summary.json")
    rows = []
    for row in record["rows"]:
        points = [f"{point['perplexity']:.2f}" for point in row["curve"][1:-1]] + [f"{row['perplexity']:.2f}"]
        change = signed(100 * row["change"], 1 if abs(row["change"]) >= 1e-3 else 2)
        curve = f"{row['perplexity_before']:.2f} → {' / '.join(points)}: {change}%"
        rows.append([OWN_TEXTS_ARMS[row["arm"]], str(row["steps"]), curve, f"{row['cpu_seconds']:.0f}",
                     f"{row['peak_rss_mib']:.0f} MiB", f"{row['learners_file_bytes'] / 1e6:.1f} MB"])  # fmt: skip
    header = ["model, optimizer (lr)", "steps", "held-out perplexity, before → at each evaluation: change", "CPU s ¹",
              "peak RSS, whole process", "learners file"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(
            ["own_texts_runs/summary.json"],
            machine(record) + ", one thread",
            ["python experiments/own_texts_runs.py /tmp/python_docs.jsonl"],
        )
    )


FEWSHOT_FILES = {"SmolLM2-135M": "llm_fewshot/llm_fewshot.json", "Gemma-3-270M": "llm_fewshot/llm_fewshot_gemma3.json"}


def fewshot() -> str:
    rows, made_on = [], ""
    for model, relative in FEWSHOT_FILES.items():
        record = load(relative)
        made_on = machine(record, MACHINE_B)
        arms = {(row["k"], row["arm"]): row for row in record["rows"]}

        def cell(row: dict) -> str:
            seeds = ", ".join(f"{100 * v:.1f}" for v in row["dev_accuracy"])
            return f"{100 * row['dev_mean']:.1f} ± {100 * row['dev_std']:.1f} ({seeds}; lr {row['lr']:.0e})"

        for k in sorted({k for k, _ in arms}):
            plain, far_arm = arms[(k, "mezo")], arms[(k, "mezo_far")]
            step = far_arm["seconds_per_step"], plain["seconds_per_step"]
            rows.append([model, str(k), f"{100 * record['zero_shot_dev_accuracy']:.1f}", cell(plain), cell(far_arm),
                         f"{step[0]:.2f} / {step[1]:.2f} s = {step[0] / step[1]:.2f}"])  # fmt: skip
    header = [
        "model",
        "k per class",
        "zero-shot",
        "MeZO, all weights",
        "MeZO + FAR r=0.4",
        "step, FAR / plain (1 thread)",
    ]
    return (
        table(header, rows)
        + "\n"
        + source(
            list(FEWSHOT_FILES.values()),
            made_on,
            ["python experiments/llm_fewshot.py"],
        )
    )


CLOCK_ARMS = {
    "mezo": "plain MeZO",
    "far_top10": "**MeZO + FAR with depth (the default)**",
    "far": "MeZO + FAR r=0.4, every layer",
    "magnitude": "Sparse-MeZO's rule, nodes (r=0.4)",
    "lezo": "LeZO (a quarter of the layers a step)",
}


def on_the_clock(model: str, k: int, commands: list[str]) -> Callable[[], str]:
    """Few-shot SST-2 on the clock: each arm's final accuracy after the same CPU seconds, and when the default
    reaches plain MeZO's final mean (with the evaluation before it, to show the margin)."""

    def write() -> str:
        record = load("llm_fewshot_time/summary.json")
        rows = []
        found = {row["arm"]: row for row in record["rows"] if row["model"] == model and row["k"] == k}
        plain = found["mezo"]
        for arm, label in CLOCK_ARMS.items():
            if arm not in found:
                continue
            row = found[arm]
            cells = [label, rate(row["lr"]), f"{100 * row['grid_accuracy']:.1f}"]
            if not row["seeds"]:
                rows.append([*cells, "grid only", "", "", ""])
                continue
            bold = "**" if arm == "far_top10" else ""
            if arm == "mezo":
                reach = f"at {row['seconds']:.0f} s (its end)"
            else:
                at = row["seconds_to_mezo_final"]
                reach = f"at {at:.0f} s: {bold}{row['time_to_mezo_final_vs_mezo']:.2f}×{bold} plain MeZO's time"
                before = [p for p in row["mean_curve"] if p["seconds"] < at - 1]
                if before:
                    last = before[-1]
                    short = 100 * (plain["final_mean"] - last["accuracy"])
                    stood = f"{100 * last['accuracy']:.1f}, {short:.1f} short"
                    reach += f"; at {last['seconds']:.0f} s the mean stood at {stood}"
            rows.append([*cells, " / ".join(f"{100 * v:.1f}" for v in row["final_accuracy"]),
                         f"{bold}{100 * row['final_mean']:.1f} ± {100 * row['final_std']:.1f}{bold}",
                         f"{row['steps']:.0f}", reach])  # fmt: skip
        header = ["arm", "lr", "seed-0 grid, 100 steps: dev", f"dev accuracy at {record['seconds']:.0f} s (seeds)",
                  "mean ± std", f"steps in {record['seconds']:.0f} s", "reaches plain MeZO's final mean"]  # fmt: skip
        return table(header, rows) + "\n" + source(
            ["llm_fewshot_time/summary.json"], machine(record) + ", one thread a run",
            commands,
        )  # fmt: skip

    return write


def device_machine(record: dict) -> str:
    """device_train's machine: 'CPU; flags', and its core count."""
    cpu, _, flags = record["machine"].partition("; ")
    bf16 = "avx512_bf16" if "avx512_bf16" in flags.split() else "no native bf16"
    return f"{cpu}, {record['cores']} cores ({bf16}), one thread"


def planned(plan: str) -> str:
    """'772 + 22 MB' from far_train's plan line (train.pte's and bottom.pte's planned memory)."""
    sizes = [float(size) for size in re.findall(r"\(planned ([0-9.]+) MB\)", plan)]
    return " + ".join(f"{size:.0f}" if size >= 10 else f"{size:.1f}" for size in sizes) + " MB"


def device_step() -> str:
    record = load("device_train/step.json")
    rows = []
    for row in record["rows"]:
        batch = int(row["shape"].split("x")[0])
        micro = row["micro_batch"]
        programs = str(micro) if micro == batch else f"{batch // micro} micro-batches of {micro}"
        rows.append([row["shape"].replace("x", " x "), programs, f"{row['runner_step_s']:.3f}",
                     f"{row['eager_step_s']:.3f}", f"**{row['runner_over_eager']:.2f}**",
                     f"{row['runner_peak_rss_MiB']:.0f} MiB"])  # fmt: skip
    header = ["shape", "programs' batch", "far_train step (s)", "torch eager step (s)", "far_train / eager",
              "far_train peak RSS"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(["device_train/step.json"], device_machine(record), [f"python {record['command']}"])
    )


def device_memory() -> str:
    record = load("device_train/memory.json")
    rows = []
    for row in record["rows"]:
        micro = row["micro_batch"]
        parts = record["batch"] // micro
        programs = f"{micro} (one micro-batch)" if parts == 1 else f"{micro} ({parts} micro-batches)"
        rows.append([programs, planned(row["plan"]), f"{row['step_s']:.2f}", f"{row['peak_rss_MiB']:.0f} MiB"])
    header = ["programs' batch", "planned memory (train.pte + bottom.pte)", "step (s)", "peak RSS"]
    return (
        table(header, rows)
        + "\n"
        + source(["device_train/memory.json"], device_machine(record), [f"python {record['command']}"])
    )


LOWERING_LEVELS = {  # lowering.json's rows: far_train on the executorch wheel's kernels
    "none": "`none`: ExecuTorch's optimized + portable kernels",
    "matmul": "`matmul`: the matrix products in XNNPACK",
    "all": "`all`: every operator XNNPACK takes, op by op",
}


def lowering_row(label: str, row: dict) -> list[str]:
    export = row["export"]
    return [label, f"{export['cpu_s']:.0f} ({export['wall_s']:.0f})", f"{export['peak_rss_MiB']:.0f} MiB",
            f"{export['sizes_bytes']['train.pte'] / 1e6:.1f} MB", f"{export['planned_bytes']['train'] / 1e6:.0f} MB",
            f"{row['runner_step_cpu_s']:.2f}", f"{row['eager_step_cpu_s']:.2f}", f"**{row['runner_over_eager']:.2f}**",
            f"{row['runner_peak_rss_MiB']:.0f} MiB"]  # fmt: skip


def all_pays_back(levels: dict) -> str:
    """What `all` costs to export beyond `none`, what it saves a step, and the steps that win the export back."""
    extra = levels["all"]["export"]["cpu_s"] - levels["none"]["export"]["cpu_s"]
    saved = levels["none"]["runner_step_cpu_s"] - levels["all"]["runner_step_cpu_s"]
    return (
        f"costs {extra:.0f} CPU s more to export than `none` and saves {saved:.2f} CPU s a step: it pays from about "
        f"{extra / saved:.0f} steps"
    )


def device_lowering() -> str:
    """docs/device.md: each XNNPACK level's export cost, program size and step, from device_train's lowering file."""
    record = load("device_train/lowering.json")
    levels = {row["xnnpack"]: row for row in record["rows"]}
    rows = [lowering_row(label, levels[level]) for level, label in LOWERING_LEVELS.items()]
    kernels = load("device_train/lowering_none_matmul_all.json")  # again, far_train on far's kernels (FAR_KERNELS)
    for row in kernels["rows"]:
        rows.append(lowering_row(f"`{row['xnnpack']}`, far_train on far's kernels", row))
    header = ["training program (`--xnnpack`)", "export: CPU s (wall s)", "export peak RSS", "train.pte",
              "planned memory (train.pte)", "far_train step (CPU s)", "torch eager step (CPU s)", "far_train / eager",
              "far_train peak RSS"]  # fmt: skip
    sizes = levels["none"]["export"]["sizes_bytes"]
    files = ("bottom.pte", "state.safetensors", "tokenizer.json")
    others = ", ".join(f"{name} {sizes[name] / 1e6:.1f} MB" for name in files)
    ours = {row["xnnpack"]: row for row in kernels["rows"]}
    loads = ", ".join(f"{row['export']['load_average']:.1f} / {row['load_average']:.1f}" for row in record["rows"])
    losses = ", ".join(f"`{level}` {levels[level]['runs']['runner'][0]['last_loss']:.6f}" for level in LOWERING_LEVELS)
    ours_losses = ", ".join(f"{row['runs']['runner'][0]['last_loss']:.6f}" for row in kernels["rows"])
    return (
        table(header, rows)
        + f"\nThe other files are the same at every level: {others}. On the wheel's kernels `all` "
        + f"{all_pays_back(levels)}; on far's, it {all_pays_back(ours)}. The load average (1 minute) at the end of "
        + f"each level's export / steps on the wheel's kernels: {loads}. far_train's loss at step {record['steps']} "
        + f"of the first round, on the same learners and batches: {losses}; on far's kernels {ours_losses}.\n\n"
        + source(
            ["device_train/lowering.json", "device_train/lowering_none_matmul_all.json"],
            device_machine(record),
            [f"python {record['command']}", f"python {kernels['command']}"],
        )
    )


def device_bound() -> str:
    """docs/device.md: the least a runtime must keep per programs' batch, from device_train's bound file."""
    record = load("device_train/bound.json")
    trainable, frozen = record["trainable_bytes"] / MIB, record["trained_layers_frozen_bytes"] / MIB
    rows = []
    for row in record["rows"]:
        batch = row["batch"]
        parts = 32 // batch
        programs = f"{batch} (one pass)" if parts == 1 else f"{batch} ({parts} micro-batches)"
        saved = row["saved_for_backward_bytes"] / MIB
        summed = trainable if parts > 1 else 0.0  # the micro-batches' gradient sum
        total = saved + frozen + 4 * trainable + summed
        rows.append([programs, f"{saved:.1f}", f"{frozen:.1f}", f"{4 * trainable:.1f}",
                     f"{summed:.1f}" if summed else "", f"**{total:.1f}**"])  # fmt: skip
    header = ["programs' batch", "kept for backward (MiB)", "trained layers' frozen weights (MiB)",
              "AdamW: tensors, gradients, two moments (MiB)", "micro-batches' gradient sum (MiB)",
              "sum (MiB)"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(["device_train/bound.json"], device_machine(record), [f"python {record['command']}"])
    )


# Per task: the row's label, the metric, and the committed 3-seed host runs whose spread the table quotes as noise.
METRIC_TASKS = {
    "sst2": (
        "SST-2 (first {n:,} sentences; 872 dev)",
        "accuracy",
        "replicate_far/grouped/runs/sst2-far-auto+depth-1+cache-s",
        "FAR auto with 1 frozen layer, 8,000 sentences, 1 epoch",
    ),
    "cola": (
        "CoLA (first {n:,} sentences; 1,043 dev; MCC)",
        "matthews_correlation",
        "replicate_far/runs/cola-far-0.2+frozen-emb-s",
        "FAR r=0.2, 3 epochs",
    ),
}


def run_epochs(record: dict) -> float:
    """A metric file's epochs, from its planned steps (far's steps per epoch count the last, short batch)."""
    return record["plan"]["total_steps"] / -(-record["train_examples"] // 32)


def host_cell(host: dict, metric: str) -> str:
    """A host arm's metric in points and the precision its training ran in (as its file records it)."""
    precision = host.get("trained", {}).get("precision", {}).get("name", "precision not recorded")
    return f"{100 * host['metrics'][metric]:.2f} ({precision})"


def device_metric() -> str:
    """docs/device.md: far_train's model against far train's, per task, from device_train's metric files."""
    rows, files, commands, noise = [], [], [], []
    for task, (label, metric, seeds, runs) in METRIC_TASKS.items():
        record = load(f"device_train/metric_{task}.json")
        without = load(f"device_train/metric_{task}_host_no_dropout.json")
        files += [f"device_train/metric_{task}.json", f"device_train/metric_{task}_host_no_dropout.json"]
        commands += [f"python {record['command']}", f"python {without['command']}"]
        if "device_stage_command" in record:  # the device stage went on from the host run's checkpoint
            commands.append(f"python {record['device_stage_command']}")
        n = record["train_examples"]
        epochs = f"{run_epochs(record):g}"
        if "plan" in without and run_epochs(without) != run_epochs(record):
            epochs += f" (no dropout: {run_epochs(without):g})"
        device = record["device"]
        if device is None:
            device_cells = ["not run", "", ""]
        else:
            gap = 100 * (device["metrics"][metric] - without["host"]["metrics"][metric])
            device_cells = [f"**{100 * device['metrics'][metric]:.2f}**", signed(gap),
                            f"{record['learners_file_bytes'] / 1e6:.1f} MB"]  # fmt: skip
        rows.append([label.format(n=n), epochs, host_cell(record["host"], metric),
                     host_cell(without["host"], metric), *device_cells])  # fmt: skip
        points = [100 * load(f"{seeds}{seed}/metrics.json")["metrics"][metric] for seed in range(3)]
        listed = ", ".join(f"{point:.2f}" for point in points)
        noise.append(f"{label.split(' (')[0]} {mean_std(points)} ({runs}: seeds {listed}; "
                     f"`experiments/results/{seeds}{{0,1,2}}`)")  # fmt: skip
    header = ["task (training data; dev)", "epochs", "far train, dropout (its default)", "far train, no dropout",
              "device (far_train, fp32)", "device − far train without dropout", "learners file"]  # fmt: skip
    return (
        table(header, rows)
        + "\nOne seed (0) per arm. The host's spread over 3 seeds in committed runs of nearby configurations (frozen "
        + "embeddings, max length 128, fp32, far's default dropout), the noise to expect: "
        + "; ".join(noise)
        + ".\n\n"
        + source(files, device_machine(record), commands)
    )


OPTIMIZER_ARMS = {
    "mezo-plain": "MeZO, every weight",
    "mezo-far": "MeZO + FAR with depth",
    "zo-batched-far": "batched one-sided ZO (n=4) + FAR with depth",
    "adamw-far": "**AdamW on FAR's learners with depth**",
}


def own_texts_optimizers() -> str:
    summary = load("own_texts_optimizers/summary.json")
    before = summary["table"][0]["perplexity_before"]
    rows = []
    for row in summary["table"]:
        arm = load(f"own_texts_optimizers/{row['arm']}.json")
        grid = ", ".join(rate(point["lr"]) for point in arm["lr_grid"])
        change = 100 * (row["perplexity_at_budget"] / row["perplexity_before"] - 1)
        bold = "**" if row["arm"] == "adamw-far" else ""
        result = f"{bold}{row['perplexity_at_budget']:.2f}: {signed(change, 2 if abs(change) < 1 else 1)}%{bold}"
        rows.append([OPTIMIZER_ARMS[row["arm"]], f"{rate(row['lr'])} ({grid})", str(row["steps"]),
                     f"{row['step_cpu_seconds']:.1f} ({row['eval_cpu_seconds']:.1f})", result,
                     f"{row['peak_rss_mib']:,.0f} MiB"])  # fmt: skip
    header = ["arm", "lr (grid)", "steps", "CPU s of steps (eval apart)", f"held-out perplexity, {before:.2f} before",
              "peak RSS (this harness)"]  # fmt: skip
    return table(header, rows)


LLM_MEMORY = [
    ("Gemma-3-270M", "MeZO + FAR, the default (10% of the nodes, bottom 12 of 18 layers frozen)", "gemma3-270m"),
    ("SmolLM2-135M", "MeZO + FAR, the default (10% of the nodes, bottom 20 of 30 layers frozen)", "smollm2-135m"),
    ("Gemma-3-270M", "MeZO + FAR r=0.4", "llm_memory_gemma3_far"),
    ("Gemma-3-270M", "inference", "llm_memory_gemma3_inf"),
    ("SmolLM2-135M", "MeZO + FAR r=0.4, saving its fine-tune", "llm_memory_smollm2_far"),
    ("SmolLM2-135M", "MeZO + FAR r=0.4, fp32 learners ¹", "llm_memory_smollm2_far32"),
    ("SmolLM2-135M", "MeZO (plain)", "llm_memory_smollm2_full"),
    ("SmolLM2-135M", "inference", "llm_memory_smollm2_inf"),
]


def time_v(model: str) -> tuple[str, float]:
    """A `/usr/bin/time -v` record of the default run: its command (data and output folders left out) and peak MiB."""
    text = (RESULTS / "llm_memory" / f"time_v_{model}_default.txt").read_text()
    command = re.search(r'Command being timed: "(.*)"', text).group(1).removeprefix(".venv/bin/")
    command = re.sub(r" --(data-dir|output-dir) \S+| --no-progress", "", command)
    kbytes = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return f"`/usr/bin/time -v {command}` ²", kbytes / 1024


def llm_memory() -> str:
    rows = []
    for model, case, source_name in LLM_MEMORY:
        if source_name.startswith("llm_memory_"):
            (record,) = load(f"llm_memory/{source_name}.json")["cases"].values()
            command, extra = record["command"], ""
            if command.endswith(" (evaluation only)"):
                command, extra = command.removesuffix(" (evaluation only)"), ", evaluation only"
            rows.append([model, case, f"`{command}`{extra}", f"{record['peak_rss_mib']:.0f} MiB"])
        else:
            command, peak = time_v(source_name)
            rows.append([model, case, command, f"{peak:.0f} MiB"])
    return table(["model", "case", "command", "peak RSS"], rows)


def clock_curve(model: str, k: int) -> Callable[[], str]:
    """One seed on the clock: each arm's dev accuracy at every evaluation, and when the default reaches plain MeZO's
    final accuracy."""

    def write() -> str:
        record = load("llm_fewshot_time/summary.json")
        found = {row["arm"]: row for row in record["rows"] if row["model"] == model and row["k"] == k}
        rows = []
        for arm in ("mezo", "far_top10"):
            row = found[arm]
            label = CLOCK_ARMS[arm] if arm == "mezo" else "**MeZO + FAR with depth**"
            points = [f"{100 * point['accuracy']:.1f}" for point in row["mean_curve"][1:]]
            points[-1] = f"**{points[-1]}**"
            if arm == "mezo":
                reach = f"at {row['seconds']:.0f} s (its end)"
            else:
                reach = f"at {row['seconds_to_mezo_final']:.0f} s: **{row['time_to_mezo_final_vs_mezo']:.2f}×**"
            edge = " (grid edge)" if row["lr_at_grid_edge"] and arm != "mezo" else ""
            rows.append([label, rate(row["lr"]) + edge, f"{100 * row['grid_accuracy']:.1f}", " / ".join(points),
                         f"{row['steps']:.0f}", reach])  # fmt: skip
        # the evaluations fall every --eval-seconds 150 of training, give or take a step
        times = " / ".join(f"{150 * round(point['seconds'] / 150)}" for point in found["mezo"]["mean_curve"][1:])
        header = ["arm", "lr", "seed-0 grid, 100 steps: dev", f"dev accuracy at {times} s",
                  f"steps in {record['seconds']:.0f} s", "reaches plain MeZO's final"]  # fmt: skip
        return table(header, rows)

    return write


MEZO_CONFIGS = [
    ("plain", "plain MeZO (every weight)"),
    ("far-0.4", "MeZO + FAR r=0.4, embeddings frozen"),
    ("far-0.4+learners-only", "MeZO + FAR r=0.4, learners only"),
]


def mezo_step() -> str:
    """`far.MeZO`'s step (bench_mezo.json) beside the record-based MeZO's (bench_mezo_before.json)."""
    now, records = load("bench_mezo/bench_mezo.json")["steps"], load("bench_mezo/bench_mezo_before.json")["steps"]
    rows = []
    for config, label in MEZO_CONFIGS:
        step, before = now[config], records[config]
        split = step["split_medians"]
        if config == "plain":
            ratio, bound = "1", "1"
        else:
            ratio = f"{step['ratio_to_plain']:.3f} ({step['paired_ratio_median']:.3f})"
            bound = f"{step['ratio_bound']:.3f}"
        rows.append([label, f"{step['trainable_parameters'] / 1e6:.1f}M",
                     f"{before['step_seconds_median']:.2f} → {step['step_seconds_median']:.2f} s", ratio, bound,
                     f"{split['forwards']:.2f} / {split['noise']:.2f} / {split['arithmetic']:.2f} s"])  # fmt: skip
    header = ["configuration", "perturbed", "step, record-based → `far.MeZO`", "/ plain's, `far.MeZO` (paired)",
              "bound", "`far.MeZO`: forwards / noise / arithmetic"]  # fmt: skip
    return table(header, rows)


def lean_learners() -> str:
    """The lean runtime's learners file (lean_learners_file/report.json): size against the GGUF, swaps, generation."""
    report = load("lean_learners_file/report.json")
    gguf, files, swap = report["gguf_bytes"], report["files"], report["swap"]
    long, short = files["user-0"], files["user-1"]
    steps = [report["runs"][user]["steps"] for user in ("user-0", "user-1")]
    whole = 2 * long["values"]  # every trained value kept as a whole bf16 (2 bytes)
    start = report["generate_startup"]

    def share(part: dict) -> str:
        return f"{100 * part['bytes'] / gguf:.1f}%"

    def patched(part: dict) -> str:
        return f"{100 * part['patched_values'] / part['values']:.1f}%"

    rows = [
        [f"learners file, {steps[0]} steps / {steps[1]} steps",
         f"{long['bytes'] / 1e6:.2f} MB / {short['bytes'] / 1e6:.2f} MB: {share(long)} / {share(short)} of the"
         f" {gguf / 1e6:.2f} MB GGUF file ({long['values'] / 1e6:.1f}M values,"
         f" {patched(long)} / {patched(short)} of them patched)", "<= 25%"],
        ["bf16 values kept whole instead (the `trained.safetensors` layout, at these learners)",
         f"{whole / 1e6:.1f} MB, {100 * whole / gguf:.0f}%", ""],
        ["first load of a file (hashes the GGUF file once per model, and the file)",
         f"{swap['first_load_ms']['cpu']:.0f} ms CPU ({swap['first_load_ms']['wall']:.0f} ms wall)", ""],
        ["swap to a file not seen before (its sha256 checked)",
         f"{swap['first_swap_ms']['cpu']:.0f} ms CPU ({swap['first_swap_ms']['wall']:.0f} ms wall)", ""],
        [f"swap between files this model verified before, median of {swap['swaps']}",
         f"{swap['median_swap_cpu_ms']:.0f} ms CPU ({swap['median_swap_wall_ms']:.0f} ms wall)", "<= 50 ms"],
        ["A -> B -> A against A loaded fresh", "bit for bit" if report["a_b_a_bit_for_bit"] else "differs", ""],
        [f"`far generate --learners A --max-new-tokens 1`, whole process, median of {len(start['cpu_seconds'])}",
         f"{start['median_cpu_seconds']:.1f} s CPU ({start['median_wall_seconds']:.1f} s wall)", "<= 5 s"],
    ]  # fmt: skip
    for number, token in enumerate(report["tokens"]):
        what = "a new token over the KV cache / running the whole text again" if number == 0 else "the same"
        rows.append([f"{what}, {token['context_tokens']}-token text",
                     f"{token['cached_ms']:.0f} / {token['whole_text_again_ms']:.0f} ms (wall)", ""])  # fmt: skip
    return table(["", "measured", "target"], rows)
