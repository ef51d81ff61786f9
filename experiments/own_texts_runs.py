"""`far train` on a user's texts, one fresh process per optimizer: held-out perplexity against CPU seconds and
whole-process peak RSS, as a user running the command gets them.

The arms train SmolLM2-135M (and Gemma-3-270M with AdamW) on the corpus of `experiments/own_texts_corpus.py`
(CPython's documentation topics) with `far train`'s defaults (FAR with depth: bottom two thirds frozen,
their output kept on disk and their weights freed; 10% of the FFN nodes as learners above), batches of 4
chunks of 256 tokens, the first 24 held-out chunks scored every few steps, one thread. Each run's
metrics.json and log.jsonl (the perplexity at each evaluation with the CPU seconds so far) land in
`experiments/results/own_texts_runs/<arm>/`; a finished arm is not run again. The learning rates are those
`experiments/own_texts_optimizers.py` picked on chunks held out of the training split.

    python experiments/own_texts_corpus.py                      # writes /tmp/python_docs.jsonl
    python experiments/own_texts_runs.py /tmp/python_docs.jsonl --arms adamw mezo
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from harness import machine, results_dir, run_far_unless_done, write_report

# arm -> far train options beyond the common ones (a later --model replaces the common one)
ARMS = {
    "adamw": ["--optimizer", "adamw", "--lr", "3e-4", "--max-steps", "48", "--eval-every", "16"],
    "mezo": ["--optimizer", "mezo", "--lr", "1e-4", "--max-steps", "96", "--eval-every", "32"],
    "zo-batched": ["--optimizer", "zo-batched", "--lr", "1e-5", "--max-steps", "40", "--eval-every", "20"],
    "mezo-plain": [
        "--method",
        "full",
        "--optimizer",
        "mezo",
        "--lr",
        "1e-6",
        "--max-steps",
        "48",
        "--eval-every",
        "16",
    ],
    "gemma3-adamw": [
        *("--model", "gemma3-270m", "--optimizer", "adamw", "--lr", "3e-4"),
        *("--max-steps", "32", "--eval-every", "16"),
    ],
}
COMMON = ["--model", "smollm2-135m", "--batch-size", "4", "--max-eval-samples", "24", "--no-progress"]


def curve(run: Path, record: dict) -> list[dict]:
    """(CPU seconds of training, perplexity) at step 0 and at each evaluation, from the run's step log."""
    points = [{"step": 0, "cpu_seconds": 0.0, "perplexity": record["before"]["perplexity"]}]
    for line in (run / "log.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("step") and "eval" in entry:
            points.append(
                {"step": entry["step"], "cpu_seconds": entry["cpu_seconds"], "perplexity": entry["eval"]["perplexity"]}
            )
    return points


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", help="the corpus (experiments/own_texts_corpus.py writes /tmp/python_docs.jsonl)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--output", type=Path, default=results_dir(__file__))
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # the runs' own thread count: one, as on a phone's small core
    rows = []
    for arm in args.arms:
        run = args.output / arm
        argv_far = ["train", "--train-file", args.texts, *COMMON, *ARMS[arm]]
        record = run_far_unless_done(argv_far, run)
        rows.append(
            {
                "arm": arm,
                "far_command": " ".join(["far", *argv_far, "--output-dir", str(run)]),
                "model": record["model"],
                "optimizer": record["optimizer"],
                "method": record["method"],
                "lr": record["hyperparameters"]["lr"],
                "steps": record["steps"],
                "perplexity_before": record["before"]["perplexity"],
                "perplexity": record["metrics"]["perplexity"],
                "change": record["perplexity_change"],
                "cpu_seconds": record["cpu_seconds"],
                "peak_rss_mib": record["peak_rss_bytes"] / 2**20,
                "learners_file_bytes": record["learners_file_bytes"],
                "curve": curve(run, record),
            }
        )
        print(
            f"{arm:13s} perplexity {rows[-1]['perplexity_before']:.2f} -> {rows[-1]['perplexity']:.2f} "
            f"({100 * rows[-1]['change']:+.1f}%), {rows[-1]['cpu_seconds']:.0f} CPU s, "
            f"peak RSS {rows[-1]['peak_rss_mib']:.0f} MiB"
        )
    summary_path = args.output / "summary.json"
    old = json.loads(summary_path.read_text())["rows"] if summary_path.exists() else []
    done = {row["arm"] for row in rows}
    summary = {  # rows from several invocations (--arms): each row names its own far command
        "machine": machine(),
        "rows": sorted(
            [row for row in old if row["arm"] not in done] + rows, key=lambda row: list(ARMS).index(row["arm"])
        ),
    }
    write_report(summary_path, summary)
    return summary


if __name__ == "__main__":
    main()
