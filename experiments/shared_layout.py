"""A layout primed once and shared: SST-2's training set as disjoint users, each trained three ways.

SST-2's training split, shuffled once (seed 0), is cut into `--users` disjoint users of `--rows` rows each; every
run scores SST-2's dev split (872 rows). For each seed, user 0's rows are primed once (`far prime`, the layout of
that seed), and every other user is trained three ways, one `far train` process at a time, one thread each:

- full: full fine-tuning (`--method full`);
- far: FAR's automatic configuration with its own priming (`--method far`, the default);
- layout: the layout primed on user 0 (`--layout`): the same surgery, no priming step.

Each run's whole-process CPU seconds are measured (`harness.run_far`), the prime's too. The layout arm's cost
per user counts the prime once over the users that share it: its run's CPU seconds plus the prime's divided by
the number of users trained with it. The report (`shared_layout.json`) and its table (`shared_layout.md`) go to
`--output`; the runs and the users' files to `--work`, which a stopped grid resumes from.

    OMP_NUM_THREADS=1 FAR_DATA_DIR=../shared/data python experiments/shared_layout.py --users 3 --rows 500 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

from harness import (
    FAR,
    add_output_argument,
    children_cpu_seconds,
    command_line,
    machine,
    results_dir,
    run_far_unless_done,
    write_report,
)

ARMS = ("full", "far", "layout")
SHARED_BY = (1, 2, 10, 0)  # users sharing one prime, for the report (0: the layout run alone)


def glue_dir() -> Path:
    return Path(os.environ.get("FAR_DATA_DIR", "../shared/data")) / "glue" / "SST-2"


def write_users(work: Path, users: int, rows: int) -> list[Path]:
    """SST-2's training rows, shuffled with seed 0, as `users` disjoint TSV files of `rows` rows each."""
    with open(glue_dir() / "train.tsv", newline="") as f:
        table = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, body = table[0], table[1:]
    if users * rows > len(body):
        raise SystemExit(f"{users} users of {rows} rows need {users * rows}; SST-2's training split has {len(body)}")
    random.Random(0).shuffle(body)
    paths = []
    for user in range(users):
        path = work / "users" / f"user{user}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
            writer.writerows([header, *body[user * rows : (user + 1) * rows]])
        paths.append(path)
    return paths


def prime_unless_done(user0: Path, layout: Path, common: list[str], seed: int) -> dict:
    """`far prime` on user 0's rows, in a process of its own, with its CPU seconds; the record is kept beside it."""
    record_path = layout.with_suffix(".json")
    if record_path.exists() and layout.exists():
        return json.loads(record_path.read_text())
    argv = ["prime", "--train-file", str(user0), "--output", str(layout), "--overwrite", "--seed", str(seed), *common]
    print(f"$ far {' '.join(argv)}", flush=True)
    start, cpu = time.perf_counter(), children_cpu_seconds()
    subprocess.run([*FAR, *argv], check=True)
    record = {"process_seconds": time.perf_counter() - start, "process_cpu_seconds": children_cpu_seconds() - cpu}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def arm_argv(arm: str, layout: Path) -> list[str]:
    return {"full": ["--method", "full"], "far": ["--method", "far"], "layout": ["--layout", str(layout)]}[arm]


def summary(runs: list[dict], primes: dict[int, dict], sharing: int) -> dict:
    """Each arm's mean accuracy (points) and CPU seconds per user, and their ratio to full fine-tuning's."""
    out = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        shared = {seed: p["process_cpu_seconds"] / sharing if arm == "layout" else 0.0 for seed, p in primes.items()}
        cpu = [r["cpu_seconds"] + shared[r["seed"]] for r in mine]
        acc = [100 * r["accuracy"] for r in mine]
        out[arm] = {
            "runs": len(mine),
            "accuracy": {"mean": statistics.mean(acc), "std": statistics.pstdev(acc)},
            "cpu_seconds_per_user": statistics.mean(cpu),
            "run_cpu_seconds": statistics.mean(r["cpu_seconds"] for r in mine),
            "priming_steps": sorted({r["priming_steps"] for r in mine}),
        }
    full = out["full"]
    for arm in ARMS:
        out[arm]["cpu_vs_full"] = out[arm]["cpu_seconds_per_user"] / full["cpu_seconds_per_user"]
        out[arm]["accuracy_vs_full"] = out[arm]["accuracy"]["mean"] - full["accuracy"]["mean"]
    out["prime_cpu_seconds"] = statistics.mean(p["process_cpu_seconds"] for p in primes.values())
    # The layout arm's cost per user were the prime shared by more users (0: the run alone, the prime left out).
    run_cpu, prime_cpu = out["layout"]["run_cpu_seconds"], out["prime_cpu_seconds"]
    out["layout"]["cpu_vs_full_shared_by"] = {
        n: (run_cpu + (prime_cpu / n if n else 0.0)) / full["cpu_seconds_per_user"] for n in SHARED_BY
    }
    return out


def markdown(report: dict) -> str:
    s, users = report["summary"], report["users"] - 1
    lines = [
        f"`{report['command']}`",
        "",
        "| arm | SST-2 dev accuracy (mean ± std) | Δ vs full | CPU s per user | × full's | priming steps | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "full": "full fine-tuning",
        "far": "FAR, own priming (`--method far`)",
        "layout": f"FAR, shared layout (`--layout`; the prime's {s['prime_cpu_seconds']:.0f} s over {users} "
        f"user{'s' if users != 1 else ''})",
    }
    for arm in ARMS:
        a = s[arm]
        lines.append(
            f"| {names[arm]} | {a['accuracy']['mean']:.2f} ± {a['accuracy']['std']:.2f} | {a['accuracy_vs_full']:+.2f} "
            f"| {a['cpu_seconds_per_user']:.0f} | {a['cpu_vs_full']:.2f} | {', '.join(map(str, a['priming_steps']))} "
            f"| {a['runs']} |"
        )
    full = s["full"]["cpu_seconds_per_user"]
    for n, ratio in s["layout"]["cpu_vs_full_shared_by"].items():
        if n != users:
            shared = f"the prime over {n} user{'s' if n != 1 else ''}" if n else "the run alone, the prime left out"
            lines.append(f"| FAR, shared layout ({shared}) | as above | | {ratio * full:.0f} | {ratio:.2f} | 0 | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=3, help="disjoint users; user 0 primes the shared layout (3)")
    parser.add_argument("--rows", type=int, default=2000, help="training rows per user (2000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--work", type=Path, default=Path("runs/shared_layout"), help="runs and users' files")
    add_output_argument(parser, results_dir(__file__), "where the report and its table go")
    args = parser.parse_args()
    paths = write_users(args.work, args.users, args.rows)
    dev = glue_dir() / "dev.tsv"
    common = ["--epochs", str(args.epochs), "--no-progress"]
    runs, primes = [], {}
    for seed in args.seeds:
        layout = args.work / f"layout-seed{seed}.safetensors"
        primes[seed] = prime_unless_done(paths[0], layout, common, seed)
        for user in range(1, args.users):
            for arm in ARMS:
                argv = ["train", "--train-file", paths[user], "--validation-file", dev, "--seed", seed, *common]
                argv += ["--no-save-model", *arm_argv(arm, layout)]
                record = run_far_unless_done(argv, args.work / f"user{user}-seed{seed}-{arm}")
                runs.append(
                    {
                        "user": user,
                        "seed": seed,
                        "arm": arm,
                        "accuracy": record["metrics"]["accuracy"],
                        "cpu_seconds": record["process_cpu_seconds"],
                        "wall_seconds": record["process_seconds"],
                        "priming_steps": record["priming_steps"],
                        "steps": record["steps"],
                        "configuration": record["configuration"],
                    }
                )
    report = {
        "command": command_line(__file__, None),
        "machine": machine(),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "users": args.users,
        "rows_per_user": args.rows,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "primes": primes,
        "runs": runs,
        "summary": summary(runs, primes, args.users - 1),
    }
    write_report(args.output / "shared_layout.json", report)
    (args.output / "shared_layout.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
