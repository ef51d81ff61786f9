"""Whole-process peak memory of `far train` / `far squad` with and without --memory-budget, side by side.

Each case is a fresh `far` process under `/usr/bin/time -v` (its "Maximum resident set size" is the
peak, priming and evaluation included). Data: STS-B sentence pairs (regression, Pearson; the training
file's pairs to train on, the first 500 dev pairs to score), written as CSVs into a temporary folder;
every case trains on the same examples for the same steps at --max-length 128, batch 32. Cases: full
fine-tuning and FAR (r=0.2, frozen embeddings) without a budget, both under the budget (a budget that
cannot fit is recorded with the smallest budget `far` names, and that budget is then run), a budget
far too small (the time to refuse), and SQuAD with FAR under 1 GiB.

    python experiments/memory_budget.py [--data-dir ../shared/data] [--steps 120] [--budget 640]

Writes `--output` (memory_budget.json and README.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import add_output_argument, machine, results_dir, write_report

from far.data.locate import resolve_data_dir
from far.training import budget as planner

REFUSED = re.compile(r"smallest that fits is (\d+) MiB")


def _pairs(source: Path, target: Path, n: int | None) -> None:
    with open(source, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    head = rows[0]
    columns = [head.index(c) for c in ("sentence1", "sentence2", "score")]
    with open(target, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "label"])
        for row in rows[1:][:n]:
            if len(row) == len(head):
                writer.writerow([row[i] for i in columns])


def _cpu_flags() -> list[str]:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if "bf16" in f or f.startswith(("amx", "avx512f", "avx2")))


def run_far(name: str, argv: list[str], out_dir: Path) -> dict:
    """One `far` process under /usr/bin/time -v: its peak, wall time, plan line and metric."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "far.cli.main", *argv]
    command += ["--no-save-model", "--no-progress", "--output-dir", str(out_dir / name)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak_kib = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    plan = re.search(r"memory plan for .*", done.stderr)  # far.finetune's plan, once the model and data are loaded
    user = re.search(r"User time \(seconds\): ([\d.]+)", done.stderr)
    system = re.search(r"System time \(seconds\): ([\d.]+)", done.stderr)
    record = {
        "case": name,
        "returncode": done.returncode,
        "peak_mib": int(peak_kib.group(1)) // 1024 if peak_kib else None,
        "wall_s": round(wall, 1),
        "cpu_s": round(float(user.group(1)) + float(system.group(1)), 1) if user and system else None,
        "plan": plan.group(0) if plan else None,
    }
    refused = REFUSED.search(done.stderr)
    if refused:
        record["refused"] = next(line for line in done.stderr.splitlines() if "error:" in line)
        record["smallest_budget"] = int(refused.group(1))
    elif done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    else:
        run = json.loads((out_dir / name / "metrics.json").read_text())
        record["metric"] = {k: round(v, 4) for k, v in run["metrics"].items() if isinstance(v, float)}
        record["runtime"] = run.get("runtime")
    print(json.dumps(record), flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir", default=None, help="GLUE/SQuAD root (default: $FAR_DATA_DIR, else ../shared/data)"
    )
    add_output_argument(parser, results_dir(__file__), "the report's folder (memory_budget.json, README.md)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--budget", type=int, default=640)
    parser.add_argument("--squad-budget", type=int, default=1024)
    parser.add_argument("--squad-steps", type=int, default=20)
    parser.add_argument("--skip-squad", action="store_true")
    args = parser.parse_args()
    # The data folder as far finds it, else ../shared/data beside the repository (where the project keeps it).
    data_root = resolve_data_dir(args.data_dir) or Path(__file__).resolve().parents[2] / "shared" / "data"
    cases: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        glue = data_root / "glue" / "STS-B"
        _pairs(glue / "train.tsv", tmp / "train.csv", None)
        _pairs(glue / "dev.tsv", tmp / "dev.csv", 500)
        common = ["train", "--train-file", str(tmp / "train.csv"), "--validation-file", str(tmp / "dev.csv")]
        common += ["--max-length", "128", "--batch-size", "32", "--max-steps", str(args.steps)]
        far_method = ["--method", "far", "--retention", "0.2", "--freeze-embeddings"]
        budget_flags = ["--memory-budget", str(args.budget)]
        for method, name in ((["--method", "full"], "full"), (far_method, "far")):
            cases.append(run_far(name, [*common, *method], tmp))
            case = run_far(f"{name} @ {args.budget}", [*common, *method, *budget_flags], tmp)
            cases.append(case)
            for _ in range(2):  # a refused budget is run again at the smallest one `far` names
                least = case.get("smallest_budget")
                if least is None:
                    break
                case = run_far(f"{name} @ {least}", [*common, *method, "--memory-budget", str(least)], tmp)
                cases.append(case)
        cases.append(run_far("far @ 300 (refused)", [*common, *far_method, "--memory-budget", "300"], tmp))
        if not args.skip_squad:
            squad = ["squad", "--data-dir", str(data_root), *far_method, "--max-steps", str(args.squad_steps)]
            squad += ["--max-train-samples", "320", "--max-eval-samples", "100"]
            cases.append(run_far("squad far", squad, tmp))
            cases.append(
                run_far(f"squad far @ {args.squad_budget}", [*squad, "--memory-budget", str(args.squad_budget)], tmp)
            )
    report = {
        "machine": {**machine(), "cpu_flags": _cpu_flags()},
        "calibration": {
            "base_mib": planner.BASE_MIB,
            "activation_factor": planner.ACTIVATION_FACTOR,
            "eval_factor": planner.EVAL_FACTOR,
            "state_bytes": planner.STATE_BYTES,
            "dynamo_mib": planner.DYNAMO_MIB,
            "datasets_mib": planner.DATASETS_MIB,
            "first_step_mib": planner.FIRST_STEP_MIB,
        },
        "command": "python experiments/memory_budget.py " + " ".join(sys.argv[1:]),
        # Each `far` process takes the threads of its environment; with one, its CPU seconds are its time on an
        # unshared core whatever else runs on the machine.
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cases": cases,
    }
    write_report(args.output / "memory_budget.json", report)
    lines = ["| case | runtime | plan | peak MiB | wall s | CPU s | metric |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        shown = c.get("refused") or c.get("plan") or "no budget"
        lines.append(
            f"| {c['case']} | {c.get('runtime', '')} | {shown} | {c['peak_mib']} | {c['wall_s']} "
            f"| {c.get('cpu_s', '')} | {c.get('metric', '')} |"
        )
    (args.output / "README.md").write_text(
        "# Memory budget\n\n`"
        + report["command"]
        + f"` (OMP_NUM_THREADS={report['omp_num_threads']})\n\n"
        + "\n".join(lines)
        + "\n\nCalibration: "
        f"{json.dumps(report['calibration'])}; CPU flags {report['machine']['cpu_flags']}.\n"
    )


if __name__ == "__main__":
    main()
