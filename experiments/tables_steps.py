"""docs/results.md's tables of single steps: the FAR layer, attention heads, the roofline, recomputation, CoLA's
shape, CUDA; and docs/design.md's costs of imports and first calls."""

from __future__ import annotations

from collections.abc import Callable

from table_sources import (
    MACHINE_A,
    MACHINE_B,
    MIB,
    PRECISION_NAMES,
    load,
    machine,
    md_command,
    md_rows,
    paired,
    params,
    signed,
    source,
    table,
)


def cuda_ratios(relative: str, configs: list[str], shapes: list[tuple[int, int, str]]) -> Callable[[], str]:
    """Paired median step ratios to full fine-tuning's on a CUDA GPU, one row per (batch, length, precision)."""

    def write() -> str:
        record = load(relative)
        found = {(r["batch"], r["length"], r["precision"]): r["configs"] for r in record["results"]}
        rows = [
            [
                f"{batch}x{length}",
                precision,
                *(f"{found[(batch, length, precision)][c]['paired_ratio_median']:.3f}" for c in configs),
            ]
            for batch, length, precision in shapes
        ]
        meta = record["meta"]
        made_on = f"one {meta['device_name']}, torch {meta['torch']}"
        return (
            table(["batch x len", "precision", *configs], rows) + "\n" + source([relative], made_on, [meta["command"]])
        )

    return write


COLA_SHAPE = [
    ("far-0.4", "FAR r=0.4", True),
    ("random-0.4", "random r=0.4", False),
    ("far-0.4+frozen-emb", "FAR r=0.4 + frozen embeddings", True),
    ("far-0.2", "FAR r=0.2", True),
    ("far-0.2+frozen-emb", "FAR r=0.2 + frozen embeddings", True),
    ("freeze-ffn", "freeze-FFN (no FFN weight trains)", False),
]


def cola_shape() -> str:
    """The step at CoLA's batch shape; end to end, a tenth of the steps primes at full's cost where FAR primes."""
    record = load("bench_step/bench_step_cola_shape.json")
    by_precision = {r["precision"]: r["configs"] for r in record["results"]}
    rows = []
    for config, label, primes in COLA_SHAPE:
        fp32, bf16 = by_precision["fp32"][config], by_precision["bf16"][config]
        run = 0.1 + 0.9 * fp32["ratio_to_full"] if primes else fp32["ratio_to_full"]
        whole = ("" if primes else "(no priming) ") + f"{signed(-100 * (1 - run), 1)}%"
        rows.append([label, f"{fp32['ratio_to_full']:.3f}", f"{bf16['ratio_to_full']:.3f}",
                     f"{fp32['flop_bound_ratio']:.3f}", whole])  # fmt: skip
    header = [
        "configuration",
        "fp32 step / full's",
        "bf16 step / full's",
        "FLOP bound",
        "end to end (10% priming), fp32",
    ]
    meta = record["meta"]
    return (
        table(header, rows)
        + "\n"
        + source(
            ["bench_step/bench_step_cola_shape.json"], f"{MACHINE_A}, {meta['threads']} threads", [meta["command"]]
        )
    )


# (file, batch, length, precision, [(config, label)]): the FAR layer's step, each cell from the run that timed it.
LAYER_CELLS = [
    ("bench_step_layer_target", 32, 64, "fp32",
     [("far-0.4", "FAR r=0.4"), ("far-0.4+recompute", "FAR r=0.4, `recompute_activations`")]),
    ("bench_step_layer_fp32", 32, 128, "fp32",
     [("far-0.4", "FAR r=0.4"), ("random-0.4", "random r=0.4"),
      ("far-0.4+recompute", "FAR r=0.4, `recompute_activations`")]),
    ("bench_step_layer_bf16", 32, 64, "bf16", [("far-0.4", "FAR r=0.4")]),
]  # fmt: skip


def layer_cells() -> list[tuple[str, dict, str, list[tuple[str, str]]]]:
    """Each LAYER_CELLS entry as (shape label, the result, the command, configs)."""
    cells = []
    for name, batch, length, precision, configs in LAYER_CELLS:
        record = load(f"bench_step/{name}.json")
        (result,) = [
            r for r in record["results"] if (r["batch"], r["length"], r["precision"]) == (batch, length, precision)
        ]
        cells.append((f"{batch} × {length}, {PRECISION_NAMES[precision]}", result, record["meta"]["command"], configs))
    return cells


def layer_step() -> str:
    rows, commands = [], []
    for shape, result, command, configs in layer_cells():
        commands.append(command)
        full = result["configs"]["full"]
        for config, label in configs:
            c = result["configs"][config]
            kept = f"{c['saved_for_backward_bytes'] / MIB:,.0f} / {full['saved_for_backward_bytes'] / MIB:,.0f} MiB"
            live = f"{c['peak_live_bytes'] / MIB:,.0f} / {full['peak_live_bytes'] / MIB:,.0f} MiB"
            rows.append([shape, label, f"{c['ratio_to_full']:.3f}",
                         f"{c['paired_ratio_median']:.3f} ({c['paired_ratio_q1']:.3f}–{c['paired_ratio_q3']:.3f})",
                         f"{c['flop_bound_ratio']:.3f}", f"{kept} ({c['saved_for_backward_ratio']:.3f})",
                         f"{live} ({c['peak_live_ratio']:.3f})", str(c["steps"])])  # fmt: skip
    header = ["shape, precision", "configuration", "AdamW step / full's: ratio", "paired (quartiles)", "FLOP bound",
              "kept for backward", "peak live", "rounds"]  # fmt: skip
    files = [f"bench_step/{name}.json" for name, *_ in LAYER_CELLS]
    return table(header, rows) + "\n" + source(files, MACHINE_B + ", 2 threads", commands)


def layer_no_grad() -> str:
    rows = []
    for shape, result, _, _ in layer_cells():
        steps = result["configs"]["far-0.4"]["steps"]
        rows.append([shape, f"{result['forward']['ratio']:.3f}", f"{result['mezo']['ratio']:.3f}", str(steps)])
    header = ["shape, precision", "no-grad forward, FAR / plain", "`far.MeZO` step, FAR / plain", "rounds"]
    return table(header, rows)


HEAD_CONFIGS = [
    ("far-0.4", "FAR r=0.4, attention untouched"),
    ("far-0.4+heads-1.0", "FAR r=0.4, heads 1.0 (split, every head a learner)"),
    ("far-0.4+heads-0.4", "FAR r=0.4, heads 0.4"),
    ("far-0.4+heads-0.2", "FAR r=0.4, heads 0.2"),
    ("far-0.2+heads-0.2+frozen-emb", "FAR r=0.2, heads 0.2, embeddings frozen"),
]


def heads_step() -> str:
    record = load("bench_step/bench_step_heads_fp32.json")
    by_shape = {(r["batch"], r["length"]): r["configs"] for r in record["results"] if r["precision"] == "fp32"}
    short, long = by_shape[(32, 64)], by_shape[(32, 128)]
    rows = []
    for number, (config, label) in enumerate(HEAD_CONFIGS):
        c = short[config]
        kept, live = f"{c['saved_for_backward_bytes'] / MIB:,.0f}", f"{c['peak_live_bytes'] / MIB:,.0f}"
        if number == 0:  # the first row names full's too
            kept += f" / {short['full']['saved_for_backward_bytes'] / MIB:,.0f} MiB"
            live += f" / {short['full']['peak_live_bytes'] / MIB:,.0f} MiB"
        rows.append([label, paired(c), f"{c['flop_bound_ratio']:.3f}", paired(long[config]),
                     f"{long[config]['flop_bound_ratio']:.3f}", f"{kept} ({c['saved_for_backward_ratio']:.3f})",
                     f"{live} ({c['peak_live_ratio']:.3f})", params(c["trainable_parameters"])])  # fmt: skip
    header = ["configuration (FFN retention, head retention)", "32 × 64: paired step / full's (quartiles)",
              "FLOP bound", "32 × 128: paired (quartiles)", "FLOP bound", "kept for backward, 32 × 64",
              "peak live, 32 × 64", "trainable"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(
            ["bench_step/bench_step_heads_fp32.json"], MACHINE_B + ", 2 threads, shared", [record["meta"]["command"]]
        )
    )


def heads_lora_step() -> str:
    fp32_record, bf16_record = (
        load("bench_step/bench_step_heads_lora_fp32.json"),
        load("bench_step/bench_step_heads_lora_bf16.json"),
    )
    fp32, bf16 = fp32_record["results"][0]["configs"], bf16_record["results"][0]["configs"]
    layer_bf16 = load("bench_step/bench_step_layer_bf16.json")["results"][0]["configs"]["far-0.4"]
    labels = [*((c, label) for c, label in HEAD_CONFIGS if c in fp32), ("lora", "LoRA r=8 (PEFT)")]
    rows = []
    for config, label in labels:
        c = fp32[config]
        if config in bf16:
            step, live = f"{bf16[config]['ratio_to_full']:.3f}", f" ({bf16[config]['peak_live_ratio']:.3f})"
        elif config == "far-0.4":
            step, live = f"({layer_bf16['ratio_to_full']:.3f}, from `bench_step_layer_bf16`)", ""
        else:
            step, live = "—", ""
        rows.append([label, paired(c), f"{c['ratio_to_full']:.3f}", f"{c['flop_bound_ratio']:.3f}", step,
                     f"{c['peak_live_ratio']:.3f}{live}"])  # fmt: skip
    header = ["configuration", "fp32: paired step / full's (quartiles)", "fp32: ratio of medians", "FLOP bound",
              "bf16: step / full's", "peak live, fp32 (bf16)"]  # fmt: skip
    return (
        table(header, rows)
        + "\n"
        + source(
            ["bench_step/bench_step_heads_lora_fp32.json", "bench_step/bench_step_heads_lora_bf16.json"],
            MACHINE_B + ", 2 threads",
            [fp32_record["meta"]["command"], bf16_record["meta"]["command"]],
        )
    )


ROOFLINE_FILES = ["bench_step/bench_step_roofline_fp32.md", "bench_step/bench_step_roofline_bf16.md"]


def roofline() -> str:
    """Measured step against the roofline per configuration: a gap above 0.05 is marked "(IQR wider)" when it is
    smaller than half the measurement's quartile spread, "✗" when it is not."""
    rows = []
    for relative in ROOFLINE_FILES:
        # the quartiles at full precision from the JSON beside the .md (the .md rounds them to 3 places)
        record = load(relative.removesuffix(".md") + ".json")
        quartiles = {
            (f"{r['batch']}x{r['length']}", r["precision"], name): (c["paired_ratio_q1"], c["paired_ratio_q3"])
            for r in record["results"]
            for name, c in r["configs"].items()
        }
        for row in md_rows(relative):
            if row["config"] == "full":
                continue
            median = float(row["paired ratio, median (IQR)"].split()[0])
            q1, q3 = quartiles[(row["batch x len"], row["precision"], row["config"])]
            gap = float(row["paired − roofline"])
            mark = "" if abs(gap) <= 0.05 else (" (IQR wider)" if abs(gap) < (q3 - q1) / 2 else " ✗")
            rows.append([row["batch x len"], row["precision"], row["config"], f"{median:.3f} ({q1:.2f}–{q3:.2f})",
                         row["FLOP bound, no depth"], row["FLOP bound"], row["roofline"],
                         row["paired − roofline"].replace("+-", "-") + mark])  # fmt: skip
    header = ["shape", "precision", "config", "measured: paired step / full's (IQR)", "FLOP bound, no depth",
              "FLOP bound, depth", "roofline", "measured − roofline"]  # fmt: skip
    return table(header, rows) + "\n" + source(
        ROOFLINE_FILES, "AMD EPYC (AVX-512 BF16, no AMX), 2 threads, CPU clock, shared",
        [md_command(relative) for relative in ROOFLINE_FILES],
    )  # fmt: skip


def roofline_rates() -> str:
    """The rates each shape's roofline was built from, and full's roofline step against its measured one."""
    rows = []
    for relative in ROOFLINE_FILES:
        for result in load(relative.removesuffix(".md") + ".json")["results"]:
            rates, full = result["rates"], result["configs"]["full"]
            flops = " / ".join(f"{rates[f'{part}_flops_per_s'] / 1e9:.0f}"
                               for part in ("forward", "input_grad", "weight_grad", "attention"))  # fmt: skip
            rows.append([f"{result['batch']}x{result['length']}", result["precision"], flops,
                         f"{rates['bytes_per_s'] / 1e9:.1f}", f"{rates['dropout_elements_per_s'] / 1e6:.0f}",
                         f"{rates['seconds_per_tensor'] * 1e6:.0f}", f"{full['roofline_step_s']:.2f}",
                         f"{full['median_step_s']:.2f}"])  # fmt: skip
    header = ["shape", "precision", "F fwd / dX / dW / attention (GFLOP/s)", "B (GB/s)", "R (M elements/s)",
              "t_tensor (µs)", "full: roofline step (CPU s)", "full: measured (CPU s)"]  # fmt: skip
    return table(header, rows)


ONE_THREAD_ROOFLINE = ["full+frozen-emb", "full+frozen-emb+bottom-3", "random-0.4", "far-0.2+frozen-emb",
                       "far-0.2+frozen-emb+bottom-3", "lora"]  # fmt: skip


def roofline_one_thread() -> str:
    """Measured paired step / full's against the roofline, one thread; ✗ where they are more than 0.05 apart."""
    record = load("bench_step/bench_step_roofline_fp32_1thread.json")
    rows = []
    for result in record["results"]:
        cells = [f"{result['batch']}x{result['length']}"]
        for config in ONE_THREAD_ROOFLINE:
            c = result["configs"][config]
            measured, model = c["paired_ratio_median"], c["roofline_ratio"]
            miss = " ✗" if abs(round(measured, 3) - round(model, 3)) > 0.05 else ""
            cells.append(f"{measured:.3f} / {model:.3f}{miss}")
        rows.append(cells)
    header = ["shape", "full+frozen-emb", "+ bottom 3", "random-0.4", "far-0.2+frozen-emb", "+ bottom 3", "LoRA"]
    return table(header, rows)


def recompute_cost() -> str:
    relative = "recompute_cost/recompute_cost.md"
    steps = {(r["precision"], r["config"]): r for r in md_rows(relative)}
    cost = {r["precision"]: r for r in md_rows(relative, 1)}
    rows = []
    for precision in ("fp32", "bf16"):
        far, again, full = (steps[(precision, c)] for c in ("random-0.4", "random-0.4+recompute", "full"))
        mib = [row["kept for backward, MiB (ratio to full)"].split() for row in (far, again, full)]
        kept = f"{mib[0][1].strip('()')} → {mib[1][1].strip('()')} ({mib[0][0]} → {mib[1][0]} MiB of {mib[2][0]})"
        rows.append([PRECISION_NAMES[precision], far["paired ratio to full (IQR)"], again["paired ratio to full (IQR)"],
                     signed(float(cost[precision]["recompute's cost, of full's step"]), 3), kept, far["FLOP bound"],
                     far["roofline"]])  # fmt: skip
    header = ["precision", "FAR r=0.4: paired step / full's (IQR)", "+ recompute (IQR)",
              "recompute's cost, of full's step (median over rounds)",
              "kept for backward / full's: FAR → FAR + recompute", "FLOP bound", "roofline"]  # fmt: skip
    return table(header, rows)


def import_costs() -> str:
    """The resident memory each import or first call adds in a fresh process with torch imported."""
    record = load("import_costs/import_costs.json")
    rows = [[row["what"], f"`{row['statement']}`", row["where"], f"{row['mib']:.1f}"] for row in record["rows"]]
    versions = ", ".join(f"{name} {v}" for name, v in record["versions"].items() if v is not None)
    made_on = f"{machine(record)}, {versions}" + ("" if record["torchao_importable"] else ", no torchao")
    return (
        table(["what is avoided", "STATEMENT", "where far avoids it", "MiB (median)"], rows)
        + "\n"
        + source(["import_costs/import_costs.json"], made_on, [record["command"]])
    )
