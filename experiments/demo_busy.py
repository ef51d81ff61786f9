"""`far demo`, the README's first command, idle and beside one busy program: its wall time and each arm's CPU seconds.

A laptop is rarely idle. This runs the demo as a user runs it (`far demo`, far's thread rule) with nothing else
running and beside `python -c "while True: pass"`, `--runs` times each, interleaved, and records the process's wall
seconds and what the demo itself measured per arm (its metrics.json: accuracy, CPU seconds), so
that FAR's default against full fine-tuning can be read in both cases.

    python experiments/demo_busy.py --data-dir ../shared/data      # one run of each: about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import (
    BUSY_LOOP,
    FAR,
    add_output_argument,
    beside_busy_loop,
    command_line,
    lscpu_flags,
    machine,
    results_dir,
    user_environment,
    write_report,
)


def one_demo(data_dir: str, busy: bool) -> dict:
    """One `far demo` process; with `busy`, beside a loop started a second before it and stopped after it."""
    with beside_busy_loop(busy) as load, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        start = time.perf_counter()
        done = subprocess.run(
            [*FAR, "demo", "--data-dir", data_dir, "--output-dir", str(out)],
            env=user_environment(),
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"far demo failed:\n{done.stderr[-3000:]}")
        metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": round(wall, 1), "load_1min_before": load, "arms": metrics["arms"], "printed": done.stdout}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data", help="where glue/SST-2 is (default ../shared/data)")
    parser.add_argument("--runs", type=int, default=1, help="demos of each case (medians reported)")
    add_output_argument(parser, results_dir(__file__) / "demo_busy.json", "the JSON report")
    args = parser.parse_args(argv)
    cases: dict[str, list[dict]] = {"idle": [], "busy": []}
    for round_ in range(args.runs):  # interleaved, so that a change in the machine's load hits both alike
        for case, runs in cases.items():
            runs.append(one_demo(args.data_dir, case == "busy"))
            print(f"round {round_ + 1}, {case}: {runs[-1]['wall_s']} s wall", flush=True)
    report = {
        "command": command_line(__file__, argv),
        "busy_loop": " ".join(BUSY_LOOP[1:]),
        "machine": {**machine(), "lscpu_flags": lscpu_flags()},
        "cases": {case: summary(runs) for case, runs in cases.items()},
        "runs": cases,
    }
    write_report(args.output, report)
    return report


def summary(runs: list[dict]) -> dict:
    """Median wall seconds and, per arm, median accuracy and CPU seconds over the runs."""
    labels = [arm["arm"] for arm in runs[0]["arms"]]
    arms = {
        label: {
            key: statistics.median(arm[key] for run in runs for arm in run["arms"] if arm["arm"] == label)
            for key in ("accuracy", "cpu_seconds")
        }
        for label in labels
    }
    return {"wall_s": statistics.median(run["wall_s"] for run in runs), "arms": arms}


if __name__ == "__main__":
    main()
