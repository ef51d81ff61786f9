"""What `recompute_activations=True` costs a step and saves of the bytes kept for backward, fp32 and bf16.

MiniLM at one shape (default 32 x 64), full fine-tuning, FAR r=0.4 (random learners) and the same with
`recompute_activations=True`, in a plain AdamW loop, timed interleaved round after round in one process
(experiments/bench_step.py's `time_cell`, with its roofline calibration). The cost of recomputing is the median over
rounds of (recompute step − FAR step) / full's step of the same round, and the same over FAR's own step; the bytes
kept for backward (experiments/step_memory.py) are ratios to full fine-tuning's. The bf16 rows give FAR r=0.4's
step under bf16 autocast against full's, both in bf16, beside their FLOP and roofline bounds.

    python experiments/recompute_cost.py --rounds 10 --clock cpu
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_step import CLOCKS, cpu_flags, time_cell
from calibrate import load_model
from harness import add_output_argument, command_line, machine, results_dir, write_report

CONFIGS = ["full", "random-0.4", "random-0.4+recompute"]


def recompute_cost(rows: dict) -> dict:
    """Median over rounds of what recomputing adds, as a fraction of full's step and of FAR's step."""
    full, far_, rec = (rows[name]["step_times_s"] for name in CONFIGS)
    return {
        "of_full_step": statistics.median((r - f) / u for r, f, u in zip(rec, far_, full, strict=True)),
        "of_far_step": statistics.median(r / f - 1 for r, f in zip(rec, far_, strict=True)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="32x64")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    add_output_argument(parser, results_dir(__file__) / "recompute_cost", "the report's path without suffix")
    args = parser.parse_args(argv)
    batch, length = map(int, args.shape.split("x"))
    base = load_model("minilm")
    cells = []
    lines = [
        "| precision | config | step (s) | paired ratio to full (IQR) | FLOP bound | roofline | kept for backward, MiB "
        "(ratio to full) | peak live, MiB (ratio) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for precision in args.precisions:
        print(f"[{args.shape} {precision}] timing {', '.join(CONFIGS)}...", flush=True)
        cell = time_cell(base, CONFIGS, batch, length, precision == "bf16", args.rounds, args.warmup, clock=args.clock)
        cell.update(precision=precision, recompute_cost=recompute_cost(cell["configs"]))
        cells.append(cell)
        for name, row in cell["configs"].items():
            lines.append(
                f"| {precision} | {name} | {row['median_step_s']:.3f} | {row['paired_ratio_median']:.3f} "
                f"({row['paired_ratio_q1']:.3f}–{row['paired_ratio_q3']:.3f}) | {row['flop_bound_ratio']:.3f} | "
                f"{row['roofline_ratio']:.3f} | {row['saved_for_backward_bytes'] / 2**20:,.0f} "
                f"({row['saved_for_backward_ratio']:.3f}) | {row['peak_live_bytes'] / 2**20:,.0f} "
                f"({row['peak_live_ratio']:.3f}) |"
            )
    lines += ["", "| precision | recompute's cost, of full's step | of FAR r=0.4's step |", "|---|---|---|"]
    for cell in cells:
        cost = cell["recompute_cost"]
        lines.append(f"| {cell['precision']} | {cost['of_full_step']:+.3f} | {cost['of_far_step']:+.3f} |")
    meta = {
        "command": command_line(__file__, argv),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "shape": args.shape,
        **cpu_flags(),
        "machine": machine(),
    }
    write_report(args.output.with_suffix(".json"), {"meta": meta, "results": cells})
    text = (
        f"`{meta['command']}` (torch {meta['torch']}, {meta['threads']} threads, {args.clock} seconds; "
        f"CPU: {meta['cpu']}, flags {' '.join(meta['flags'])}, native bf16: {meta['native_bf16']})\n\n"
        + "\n".join(lines)
        + "\n"
    )
    args.output.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
