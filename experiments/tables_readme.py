"""README.md's tables: per-user file sizes, serving users and memory budgets, and the headline results."""

from __future__ import annotations

import re

from table_sources import MIB, RESULTS, load, machine, pm, signed, source, swap_record, table


def readme_results() -> str:
    replication = load("replicate_far/replication.json")
    cola = replication["summary"]["cola"]
    heads_lora = load("replicate_far/replication_heads_lora/heads_lora.json")
    kept = load("replicate_far/replication_lora/kept_files.json")
    step = load("bench_step/bench_step_layer_target.json")
    step_far = step["results"][0]["configs"]["far-0.4"]
    grouped = load("replicate_far/grouped/grouped.json")
    memory = {case["case"]: case for case in load("bench_memory/memory_minilm.json")["cases"]}
    clock = {(row["model"], row["k"], row["arm"]): row for row in load("llm_fewshot_time/summary.json")["rows"]}
    own = {row["arm"]: row for row in load("own_texts_runs/summary.json")["rows"]}
    own_metrics = load("own_texts_runs/adamw/metrics.json")
    fewshot = load("llm_fewshot/llm_fewshot.json")
    fewshot_rows = {(row["k"], row["arm"]): row for row in fewshot["rows"]}

    far_cola = cola["far"]
    summary_rows = []
    summary_rows.append(
        [
            "FAR r=0.4 vs full fine-tuning, CoLA (3 seeds, priming included; machine A)",
            f"{signed(-100 * far_cola['time_saving_vs_full'], 1)}% train time, "
            f"{signed(100 * far_cola['metric_delta_vs_full'])} MCC ({100 * far_cola['metric']['mean']:.2f} vs "
            f"{100 * cola['full']['metric']['mean']:.2f}); STS-B "
            f"{signed(100 * replication['summary']['stsb']['far']['metric_delta_vs_full'])} Pearson, SST-2 "
            f"{signed(100 * replication['summary']['sst2']['far']['metric_delta_vs_full'])} accuracy",
            f"`{replication['command']}` (`replicate_far/replication.json`)",
        ]
    )
    hl = heads_lora["summary"]["cola"]
    summary_rows.append(
        [
            "FAR r=0.4 vs LoRA r=8 (PEFT), CoLA (3 seeds; machine B)",
            f"FAR {100 * hl['far']['metric']['mean']:.2f} MCC, LoRA {100 * hl['lora-lr2e-3']['metric']['mean']:.2f}"
            f" at lr 2e-3; train time vs full: LoRA {signed(-100 * hl['lora-lr2e-3']['time_saving_vs_full'], 1)}%,"
            f" FAR {signed(-100 * hl['far']['time_saving_vs_full'], 1)}%; kept file {kept['lora']['bytes'] / MIB:.2f}"
            f" MiB vs {kept['far']['bytes'] / MIB:.1f} MiB (`replication_lora/kept_files.json`)",
            f"`{heads_lora['command']}` (summarizes the committed runs; `replicate_far/replication_heads_lora/`)",
        ]
    )
    summary_rows.append(
        [
            f"FAR step vs full step, 32 × 64, fp32 ({step_far['steps']} rounds; {step['meta']['cpu']},"
            f" {step['meta']['threads']} threads)",
            f"{step_far['ratio_to_full']:.3f} (FLOP bound {step_far['flop_bound_ratio']:.3f})",
            f"`{step['meta']['command']}`",
        ]
    )
    g = grouped["summary"]
    auto = "far-auto+depth-1+cache"

    def ratio(task: str, method: str) -> float:
        return g[task][method]["process_cpu_seconds"]["mean"] / g[task]["full"]["process_cpu_seconds"]["mean"]

    cheap = [
        ratio(task, method)
        for task in ("cola", "sst2", "stsb")
        for method in g[task]
        if method.startswith("lora") or method == "full+frozen-bottom-3+cache"
    ]
    summary_rows.append(
        [
            "FAR's automatic configuration (`--method far --retention auto --freeze-embeddings --freeze-layers auto"
            " --cache-frozen`, K=1 on these tasks) vs full fine-tuning, one thread, batches grouped by length"
            f" ({machine(grouped)})",
            f"3 seeds each: CoLA {pm(g['cola'][auto]['metric'])} vs {pm(g['cola']['full']['metric'])} MCC at"
            f" {ratio('cola', auto):.2f}× the CPU time; SST-2 {100 * g['sst2'][auto]['metric']['mean']:.2f} vs"
            f" {100 * g['sst2']['full']['metric']['mean']:.2f} at {ratio('sst2', auto):.2f}×; STS-B"
            f" {100 * g['stsb'][auto]['metric']['mean']:.2f} vs {100 * g['stsb']['full']['metric']['mean']:.2f}"
            f" Pearson at {ratio('stsb', auto):.2f}×; LoRA and the bottom-3 baseline faster"
            f" ({min(cheap):.2f}-{max(cheap):.2f}×) but behind on CoLA or STS-B",
            f"`{grouped['command']}` (summarizes the runs; each run's command in"
            " [docs/results.md](docs/results.md#the-automatic-configuration-side-by-side-three-seeds))",
        ]
    )
    mib = {name: case["peak_rss_bytes"] / MIB for name, case in memory.items()}
    summary_rows.append(
        [
            "MeZO memory, MiniLM, batch 64 × 128, peak RSS (machine A)",
            f"inference {mib['inference']:,.0f} MiB; MeZO + FAR {mib['mezo_far']:,.0f} MiB"
            f" ({memory['mezo_far']['ratio_to_inference']:.2f}×); AdamW {mib['adamw']:,.0f} MiB"
            f" ({memory['adamw']['ratio_to_inference']:.1f}×)",
            "`python experiments/bench_memory.py` (`bench_memory/memory_minilm.json`)",
        ]
    )
    smol_far, smol_mezo = clock[("smollm2-135m", 16, "far_top10")], clock[("smollm2-135m", 16, "mezo")]
    gem_far, gem_mezo = clock[("gemma3-270m", 16, "far_top10")], clock[("gemma3-270m", 16, "mezo")]
    summary_rows.append(
        [
            "MeZO + FAR with depth (the causal-LM default) vs plain MeZO on the clock, SST-2 k=16,"
            f" {smol_far['seconds']:.0f} CPU-s, 3 seeds ({machine(load('llm_fewshot_time/summary.json'))})",
            f"SmolLM2-135M: reaches plain MeZO's final accuracy in {smol_far['time_to_mezo_final_vs_mezo']:.2f}×"
            f" its time, ends {100 * smol_far['final_mean']:.1f} ± {100 * smol_far['final_std']:.1f}"
            f" vs {100 * smol_mezo['final_mean']:.1f} ± {100 * smol_mezo['final_std']:.1f}; Gemma-3-270M: in"
            f" {gem_far['time_to_mezo_final_vs_mezo']:.2f}× its time, ends {100 * gem_far['final_mean']:.1f} ±"
            f" {100 * gem_far['final_std']:.1f} vs {100 * gem_mezo['final_mean']:.1f} ±"
            f" {100 * gem_mezo['final_std']:.1f}",
            "the commands in [docs/llm.md](docs/llm.md#on-the-clock-accuracy-against-seconds)"
            " (`llm_fewshot_time/summary.json`)",
        ]
    )
    adamw, gemma = own["adamw"], own["gemma3-adamw"]
    summary_rows.append(
        [
            "A personal LLM from your own texts: `far train --model smollm2-135m --train-file notes/` (AdamW on FAR's"
            " learners, the bottom two thirds frozen, their output on disk and their weights freed;"
            f" {own_metrics['texts']['tokens'] / 1000:.0f}k tokens of CPython's docs, {adamw['steps']} steps,"
            f" one thread; {machine(load('own_texts_runs/summary.json'))})",
            f"held-out perplexity {adamw['perplexity_before']:.2f} → {adamw['perplexity']:.2f}"
            f" ({signed(100 * adamw['change'], 0)}%) in {adamw['cpu_seconds']:.0f} CPU s at a whole-process peak of"
            f" {adamw['peak_rss_mib']:.0f} MiB; learners file {adamw['learners_file_bytes'] / 1e6:.1f} MB;"
            f" Gemma-3-270M ({gemma['steps']} steps): {gemma['perplexity_before']:.1f} → {gemma['perplexity']:.1f}"
            f" ({signed(100 * gemma['change'], 0)}%) at {gemma['peak_rss_mib']:.0f} MiB",
            "`python experiments/own_texts_runs.py /tmp/python_docs.jsonl --arms adamw gemma3-adamw`"
            " (`own_texts_runs/summary.json`, each arm's `far train` command in `far_command`;"
            " [docs/llm.md](docs/llm.md#your-own-texts))",
        ]
    )
    mezo16, far16 = fewshot_rows[(16, "mezo")], fewshot_rows[(16, "mezo_far")]
    summary_rows.append(
        [
            f"Few-shot SST-2 (MeZO protocol), SmolLM2-135M, k=16, {mezo16['steps']} steps (machine B)",
            f"zero-shot {100 * fewshot['zero_shot_dev_accuracy']:.1f}; MeZO {100 * mezo16['dev_mean']:.1f} ±"
            f" {100 * mezo16['dev_std']:.1f}; MeZO + FAR {100 * far16['dev_mean']:.1f} ± {100 * far16['dev_std']:.1f}"
            f" at {far16['seconds_per_step'] / mezo16['seconds_per_step']:.2f}× the step time",
            "`python experiments/llm_fewshot.py` (`llm_fewshot/llm_fewshot.json`)",
        ]
    )
    return table(["result", "numbers", "command"], summary_rows)


def readme_users() -> str:
    swap_command, swap = swap_record()
    budget = load("memory_budget/memory_budget.json")
    cases = {case["case"]: case for case in budget["cases"]}
    far, far_640 = cases["far"], cases["far @ 640"]
    full, full_640, full_734 = cases["full"], cases["full @ 640"], cases["full @ 734"]
    squad, squad_1024 = cases["squad far"], cases["squad far @ 1024"]
    refused = cases["far @ 300 (refused)"]
    same = "the same"
    far_ratio = far_640["wall_s"] / far["wall_s"]
    squad_ratio = squad_1024["wall_s"] / squad["wall_s"]
    rows = [
        ["swap one user's r=0.2 frozen-embedding file for another's, in place",
         f"{swap['swap_ms_median']} ms median ({swap['swap_cpu_ms_median']} ms CPU); first visit of a file"
         f" {swap['swap_ms_median_first_visit']} ms", f"`{swap_command}` (`swap_users/swap_users.txt`)"],
        [f"{swap['users']} users served from one process, whole-process peak RSS",
         f"{swap['peak_rss_mb']:.0f} MiB (base parameters {swap['base_parameter_mb']} MiB, one file"
         f" {swap['file_mb']:.1f} MiB)", same],
        ["`far train --method far --retention 0.2 --freeze-embeddings --memory-budget 640` (STS-B pairs, 128 tokens,"
         " batch 32, 120 steps)",
         f"peak RSS **{far_640['peak_mib']} MiB** ({far['peak_mib']:,} without a budget), Pearson"
         f" {far_640['metric']['pearson']:.3f} ({far['metric']['pearson']:.3f}), **{far_ratio:.2f}x**"
         f" the time ({far_640['wall_s']:.0f} s vs {far['wall_s']:.0f} s)",
         f"`{budget['command']}` (`memory_budget/memory_budget.json`)"],
        ["full fine-tuning of the same run under a budget",
         f"640 refused in {full_640['wall_s']} s (smallest that fits: {full_640['smallest_budget']}); at 734:"
         f" {full_734['peak_mib']} MiB, {full_734['wall_s'] / full['wall_s']:.2f}x its time", same],
        ["`far squad --method far ... --memory-budget 1024`",
         f"peak {squad_1024['peak_mib']} MiB ({squad['peak_mib']:,} without), {squad_ratio:.2f}x"
         " the time", same],
        ["a budget that cannot fit (300 MiB)",
         f"refused in {refused['wall_s']} s, before anything loads, naming {refused['smallest_budget']} MiB", same],
    ]  # fmt: skip
    return (
        table(["what", "number", "command"], rows)
        + "\n"
        + source(
            ["swap_users/swap_users.txt", "memory_budget/memory_budget.json"], machine(budget) + ", one thread", []
        ).replace(" Command: .", "")
    )


def readme_files() -> str:
    demo = (RESULTS / "demo.txt").read_text()
    learners, share, merged = re.search(
        r"learners\.safetensors: ([0-9.]+) MiB, (\d+)% of the merged model \(\S+: ([0-9.]+) MiB", demo
    ).groups()
    nodes = re.search(r"FAR auto: (\d+)% nodes, depth (\d+)", demo).groups()
    sizes = {
        (row["retention"], row["freeze_embeddings"]): row for row in load("learners_file_size/learners_file_size.json")
    }
    plain, frozen = sizes[(0.4, False)], sizes[(0.4, True)]
    lora = load("replicate_far/replication_lora/kept_files.json")["lora"]["bytes"]
    size_command = "`python experiments/learners_file_size.py` (`learners_file_size/learners_file_size.json`)"
    depth = "layer" if nodes[1] == "1" else f"{nodes[1]} layers"
    rows = [
        ["the whole model, merged (what full fine-tuning keeps)", f"{merged} MiB", "`far demo` (`demo.txt`)"],
        ["learners file, r=0.4",
         f"{plain['learners_file_bytes'] / 1e6:.1f} MB ({plain['plain_checkpoint_bytes'] / 1e6:.1f} MB whole model)",
         size_command],
        ["learners file, r=0.4, embeddings frozen", f"{frozen['learners_file_bytes'] / 1e6:.1f} MB", size_command],
        [f"learners file, FAR's automatic configuration (SST-2: {nodes[0]}% of the nodes, embeddings and the bottom"
         f" {depth} frozen)", f"{learners} MiB ({share}% of the merged model)", "`far demo` (`demo.txt`)"],
        ["LoRA adapter (PEFT, r=8), for comparison", f"{lora / MIB:.2f} MiB",
         "`replicate_far.py ... --kept-files` (`replicate_far/replication_lora/kept_files.json`;"
         " [docs/far-or-lora.md](docs/far-or-lora.md))"],
    ]  # fmt: skip
    return table(["per-user file", "size", "command"], rows)


def demo_busy() -> str:
    """`far demo` idle and beside a busy loop: its wall time, and each arm's accuracy and CPU seconds."""
    record = load("demo_busy/demo_busy.json")
    labels = list(record["cases"]["idle"]["arms"])
    rows = []
    for case, name in (("idle", "nothing else running"), ("busy", "beside one `while True: pass`")):
        summary = record["cases"][case]
        arms = summary["arms"]
        full = arms[labels[0]]["cpu_seconds"]
        cells = [
            f"{100 * arms[label]['accuracy']:.2f}% in {arms[label]['cpu_seconds']:.0f} CPU s "
            f"({arms[label]['cpu_seconds'] / full:.2f}x)"
            for label in labels
        ]
        rows.append([name, f"{summary['wall_s']:.0f}", *cells])
    runs = len(record["runs"]["idle"])
    header = ["`far demo`", "wall s", *labels]
    made_on = machine(record) + f"; {runs} run{'s' if runs > 1 else ''} of each, medians"
    return table(header, rows) + "\n" + source(["demo_busy/demo_busy.json"], made_on, [record["command"]])


def estimates() -> str:
    """What training commands said their steps would take, before the first, against what they took."""
    record = load("estimates/estimates.json")
    rows = [
        [f"`{r['command']}`", str(r["steps"]), f"{r['estimate_s']:.0f} s", f"{r['steps_s']:.0f} s", f"{r['ratio']:.2f}"]
        for r in record["rows"]
    ]
    header = ["command", "steps", "estimated before the first", "the steps took", "estimate / truth"]
    made_on = machine(record["meta"]) + ", shared with other jobs (both columns under the same load)"
    return table(header, rows) + "\n" + source(["estimates/estimates.json"], made_on, [record["meta"]["command"]])
