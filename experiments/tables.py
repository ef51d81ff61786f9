"""Writes the results tables of README.md and docs/*.md from the committed files under experiments/results/.

A table lives in a document between two markers, `<!-- table:NAME -->` and `<!-- /table:NAME -->`; everything
between them is this script's output and is rewritten on each run. Each table ends with the files it read, the
machine that made them and the command that made them (from the files themselves where they record it). Text
outside the markers is left alone.

    python experiments/tables.py            # rewrite every marked table
    python experiments/tables.py --check    # exit 1 and print a diff when a document differs from what it would write
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from table_sources import ROOT, copied, load, source, table
from tables_llm import (
    clock_curve,
    device_bound,
    device_lowering,
    device_machine,
    device_memory,
    device_metric,
    device_step,
    fewshot,
    lean_learners,
    llm_memory,
    mezo_step,
    on_the_clock,
    own_texts,
    own_texts_optimizers,
)
from tables_lora import against_the_paper, far_or_lora, heads_end_to_end, lora_sources
from tables_readme import demo_busy, estimates, readme_files, readme_results, readme_users
from tables_rules import (
    auto_retention,
    freeze_mass,
    portable,
    priming_gradient,
    priming_scores,
    retain_mass,
    retain_rechoice,
    retention_sweep,
)
from tables_runs import (
    bf16_seeds,
    demo_grouping,
    grouped_grid,
    grouped_vs_not,
    new_tasks,
    one_thread_cola,
    one_thread_tasks,
    phase_costs,
    practitioner,
    replication,
)
from tables_steps import (
    cola_shape,
    cuda_ratios,
    heads_lora_step,
    heads_step,
    import_costs,
    layer_no_grad,
    layer_step,
    recompute_cost,
    roofline,
    roofline_one_thread,
    roofline_rates,
)

# device_train.py's lm-step result files: what train.pte lowered its matrix products to, and which kernels
# far_train ran them on (a file without a "runner_wheel_kernels" side timed the wheel's kernels under "runner").
LM_STEP = [
    ("lm_step_smollm2-135m-transposes", "runner", "`mm` of each weight transposed first (`permute_copy`)"),
    ("lm_step_smollm2-135m-linear", "runner", "`linear` on each weight as it lies"),
    ("lm_step_smollm2-135m", "runner_wheel_kernels", "and transposes of transposes dropped (`far export`'s programs)"),
    ("lm_step_smollm2-135m", "runner", "the same programs on far's kernels (`runtime/executorch/src/kernels.cpp`)"),
]


def device_lm_step() -> str:
    rows, records = [], {}
    for name, side, programs in LM_STEP:
        record = records[name] = load(f"device_train/{name}.json")
        runner, lean = record["per_micro_batch"][side], record["per_micro_batch"]["lean"]
        kernels = "far's" if side == "runner" and "runner_wheel_kernels" in record["per_micro_batch"] else "the wheel's"
        rows.append([programs, kernels, f"{runner['cpu_s']:.2f} ({runner['wall_s']:.2f})",
                     f"{lean['cpu_s']:.2f} ({lean['wall_s']:.2f})",
                     f"**{runner['cpu_s'] / lean['cpu_s']:.2f}** ({runner['wall_s'] / lean['wall_s']:.2f})",
                     f"{record['runs'][side][0]['losses'][0]:.6f} / {record['first_loss']['lean']:.6f}"])  # fmt: skip
    header = ["train.pte's products", "kernels", "far_train: CPU s (wall s) a micro-batch",
              "lean runtime: CPU s (wall s)", "far_train / lean: CPU (wall)",
              "first step's loss, far_train / lean"]  # fmt: skip
    names = list(dict.fromkeys(name for name, _, _ in LM_STEP))
    files = [f"device_train/{name}.json" for name in names]
    commands = [f"python {records[name]['command']}" for name in names]
    return table(header, rows) + "\n" + source(files, device_machine(records[names[-1]]), commands)


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MARKED = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)

TABLES: dict[str, Callable[[], str]] = {
    "readme-results": readme_results,
    "readme-users": readme_users,
    "readme-files": readme_files,
    "own-texts": own_texts,
    "llm-memory": llm_memory,
    "own-texts-optimizers": own_texts_optimizers,
    "device-step": device_step,
    "device-memory": device_memory,
    "device-bound": device_bound,
    "device-metric": device_metric,
    "device-lowering": device_lowering,
    "device-lm-step": device_lm_step,
    "lora-sources": lora_sources,
    "far-or-lora": far_or_lora,
    "fewshot": fewshot,
    "lean-learners": lean_learners,
    "mezo-step": mezo_step,
    "clock-smollm2-k512": clock_curve("smollm2-135m", 512),
    "clock-smollm2": on_the_clock(
        "smollm2-135m",
        16,
        [
            "python experiments/llm_fewshot_time.py --phase grid --k 16",
            "python experiments/llm_fewshot_time.py --phase curves summary --k 16 --arms mezo far_top10 --seeds 0 1 2"
            " --seconds 900 --eval-seconds 150 --steps 3000",
        ],
    ),
    "clock-gemma3": on_the_clock(
        "gemma3-270m",
        16,
        [
            "python experiments/llm_fewshot_time.py --phase grid --model gemma3-270m --k 16 --arms mezo far_top10"
            " --lrs 3e-7 1e-6 3e-6 1e-5 3e-5",
            "python experiments/llm_fewshot_time.py --phase curves summary --model gemma3-270m --k 16 --arms mezo"
            " far_top10 --seeds 0 1 2 --seconds 900 --eval-seconds 150 --steps 3000",
        ],
    ),
    "paper": against_the_paper,
    "replication": replication,
    "cuda-h200": cuda_ratios(
        "bench_step_cuda/bench_step_cuda.json",
        ["far-0.2", "far-0.4", "far-0.4+frozen-emb", "full+frozen-emb+bottom-3", "far-0.2+frozen-emb+bottom-3"],
        [(32, 64, "fp32"), (32, 128, "fp32"), (8, 128, "fp32")],
    ),
    "cuda-h100": cuda_ratios(
        "bench_step_cuda/bench_step_cuda_h100.json",
        [
            "far-0.2",
            "far-0.4",
            "full+frozen-emb+bottom-3",
            "far-0.2+frozen-emb+bottom-3",
            "far-0.2+frozen-emb+bottom-2",
        ],
        [(32, 64, "fp32"), (32, 128, "fp32"), (8, 128, "fp32"), (32, 64, "bf16")],
    ),
    "cuda-h100-bert-base": cuda_ratios(
        "bench_step_cuda/bench_step_cuda_bert_base.json",
        [
            "far-0.2",
            "far-0.4",
            "far-0.39+frozen-emb+bottom-1",
            "far-0.2+frozen-emb+bottom-2",
            "full+frozen-emb+bottom-3",
            "far-0.2+frozen-emb+bottom-3",
            "lora",
        ],
        [(32, 128, "fp32"), (8, 128, "fp32"), (32, 128, "bf16"), (8, 128, "bf16")],
    ),
    "cuda-h100-default": cuda_ratios(
        "bench_step_cuda/bench_step_cuda_default_h100.json",
        ["far-0.39+frozen-emb+bottom-1", "far-0.2+frozen-emb+bottom-2", "far-0.4"],
        [(b, n, p) for p in ("fp32", "bf16") for b, n in ((32, 64), (32, 128), (8, 128))],
    ),
    **{
        f"cuda-h100-{name}": cuda_ratios(
            f"bench_step_cuda/bench_step_cuda_compile_{mode}_h100.json",
            ["far-0.39+frozen-emb+bottom-1"],
            [(32, 128, "fp32"), (8, 128, "fp32")],
        )
        for name, mode in (("compiled", "default"), ("cuda-graphs", "reduce_overhead"))
    },
    "practitioner": practitioner,
    "bf16-seeds": bf16_seeds,
    "demo-grouping": demo_grouping,
    "bf16-step": copied(
        "bench_bf16/bench_bf16.md", "AMD EPYC, 2 cores (`avx2 avx512f avx512_bf16`, no AMX), 1 thread, torch 2.13.0+cpu"
    ),
    "one-thread-cola": one_thread_cola,
    "one-thread-tasks": one_thread_tasks,
    "cola-shape": cola_shape,
    "layer-step": layer_step,
    "roofline": roofline,
    "roofline-rates": roofline_rates,
    "recompute-cost": recompute_cost,
    "roofline-one-thread": roofline_one_thread,
    "heads-step": heads_step,
    "heads-lora-step": heads_lora_step,
    "heads-end-to-end": heads_end_to_end,
    "layer-no-grad": layer_no_grad,
    "retention-sweep": retention_sweep,
    "priming-scores": priming_scores,
    "retain-mass": retain_mass,
    "freeze-mass": freeze_mass,
    "portable": portable,
    "grouped": grouped_grid,
    "grouped-vs-not": grouped_vs_not,
    "phase-costs": phase_costs,
    "priming-gradient": priming_gradient,
    "import-costs": import_costs,
    "demo-busy": demo_busy,
    "estimates": estimates,
    "auto-retention": auto_retention,
    "new-tasks": new_tasks,
    "retain-rechoice": retain_rechoice,
    "depth": copied("replicate_far/depth/depth.md", "AMD EPYC, 2 cores (`avx512_bf16`, no AMX), torch 2.13.0, idle"),
    "shared-layout": copied(
        "shared_layout/shared_layout.md",
        "AMD EPYC, 2 cores (`avx2 avx512f avx512_bf16`, no AMX), torch 2.13.0, one thread per run, shared with other "
        "jobs (only CPU seconds compare)",
    ),
}


def rewrite(text: str) -> str:
    """`text` with every marked table replaced by what this script writes for it."""

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}: add it to TABLES in experiments/tables.py or fix the marker")
        return match.group(1) + TABLES[name]() + match.group(4)

    return MARKED.sub(replace, text)


def check(documents: list[Path] = DOCUMENTS) -> list[str]:
    """The unified diffs of every document whose tables differ from what this script writes (empty when none)."""
    diffs = []
    for path in documents:
        text = path.read_text()
        wanted = rewrite(text)
        if wanted != text:
            name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
            diffs.append(
                "".join(difflib.unified_diff(text.splitlines(True), wanted.splitlines(True), name, name + " (tables)"))
            )
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff where a table differs")
    args = parser.parse_args()
    if args.check:
        diffs = check()
        if diffs:
            print("".join(diffs))
            print("tables differ from the result files: run python experiments/tables.py", file=sys.stderr)
            raise SystemExit(1)
        return
    for path in DOCUMENTS:
        text = path.read_text()
        wanted = rewrite(text)
        if wanted != text:
            path.write_text(wanted)
            print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
