"""A short `far glue` run idle and beside one busy program: far's thread rule against torch's own default.

torch starts one thread per core; with another program holding one core, its threads wait on that core and spin
while they wait. far sets the thread count from the cores that are free and lets idle threads sleep
(`far.hardware.fit_threads`, before torch loads). This runs the same short run idle and beside
`python -c "while True: pass"`, with far's rule ("fitted") and with torch's default ("torch default": torch
imported before `far.cli.main.main` runs, so the rule leaves the threads as torch set them), `--runs` times each,
and reports each case's median wall and CPU seconds (the run's process alone, from `wait4`), and the busy/idle
ratios that the targets name (CPU within 1.3x, wall within 2.2x).

    python experiments/threads_busy.py                 # 3 runs of each case: about 10 minutes on 2 idle cores
    python experiments/threads_busy.py --runs 1        # one of each: what a machine busy with other work affords
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from harness import (
    BUSY_LOOP,
    add_output_argument,
    beside_busy_loop,
    command_line,
    lscpu_flags,
    machine,
    results_dir,
    user_environment,
    write_report,
)

RUN = ["glue", "--task", "sst2", "--method", "full", "--max-train-samples", "640", "--max-steps", "20"]
RUN += ["--max-eval-samples", "64", "--no-save-model"]
# "fitted": the `far` command as installed; "torch default": torch loaded first, so `fit_threads` leaves it be.
START = {
    "fitted": "import sys; from far.cli.main import main; sys.exit(main(sys.argv[1:]))",
    "torch default": "import sys, torch; from far.cli.main import main; sys.exit(main(sys.argv[1:]))",
}
THREADS_LINE = re.compile(r"^threads: .*$", re.MULTILINE)


def one_run(policy: str, busy: bool) -> dict:
    """One `far glue` process; with `busy`, beside a loop started a second before it and stopped after it."""
    with beside_busy_loop(busy) as load, tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-c", START[policy], *RUN, "--output-dir", out]
        start = time.perf_counter()
        process = subprocess.Popen(
            command, env=user_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        err = process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"far {' '.join(RUN)} failed:\n{err[-3000:]}")
    threads = THREADS_LINE.search(err)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "load_1min_before": load,
        "threads_line": threads.group(0) if threads else "(torch's default: one thread per core, its wait)",
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (medians reported)")
    add_output_argument(parser, results_dir(__file__) / "threads_busy.json", "the JSON report")
    args = parser.parse_args(argv)
    cases = {(policy, busy): [] for policy in START for busy in (False, True)}
    for round_ in range(args.runs):  # cases interleaved, so that a change in the machine's load hits them alike
        for (policy, busy), runs in cases.items():
            runs.append(one_run(policy, busy))
            print(f"round {round_ + 1}: {policy}, {'busy' if busy else 'idle'}: {runs[-1]}", flush=True)
        report = {  # written after every round: a stopped run keeps what it measured
            "command": command_line(__file__, argv),
            "run": "far " + " ".join(RUN),
            "busy_loop": " ".join(BUSY_LOOP[1:]),
            "machine": {**machine(), "lscpu_flags": lscpu_flags()},
            "rounds": round_ + 1,
            "medians": {policy: medians(cases[policy, False], cases[policy, True]) for policy in START},
            "runs": [{"policy": p, "busy": b, **r} for (p, b), runs in cases.items() for r in runs],
        }
        write_report(args.output, report)
    for policy, med in report["medians"].items():
        print(f"{policy}: {med}")
    return report


def medians(idle: list[dict], busy: list[dict]) -> dict:
    """Median wall and CPU seconds idle and busy, and their busy/idle ratios."""
    med = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s")}
        for name, runs in (("idle", idle), ("busy", busy))
    }
    med["busy_over_idle"] = {k: round(med["busy"][k] / med["idle"][k], 2) for k in ("wall_s", "cpu_s")}
    return med


if __name__ == "__main__":
    main()
