"""Whole-process peak memory of `far train` / `far squad` with and without --memory-budget.

Each case is a fresh `far` process under `/usr/bin/time -v` (its "Maximum resident set size" is the
peak, priming and evaluation included). Data: STS-B sentence pairs (regression, Pearson), written as
CSVs into a temporary folder; every case trains on the same examples for the same steps. A budget
that cannot fit is recorded with the smallest budget `far` names, and that budget is then run.

    python experiments/memory_budget.py [--data-dir ../shared/data] [--steps 40]

Writes experiments/results/memory_budget/{memory_budget.json,README.md}.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import add_output_argument, machine, results_dir, write_report

from far.data.locate import resolve_data_dir
from far.training import budget

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
    plan = re.search(r"memory plan for .*", done.stdout)
    record = {
        "case": name,
        "returncode": done.returncode,
        "peak_mib": int(peak_kib.group(1)) // 1024 if peak_kib else None,
        "wall_s": round(wall, 1),
        "plan": plan.group(0) if plan else None,
    }
    refused = REFUSED.search(done.stderr)
    if refused:
        record["refused"] = next(line for line in done.stderr.splitlines() if "error:" in line)
        record["smallest_budget"] = int(refused.group(1))
    elif done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    else:
        metrics = json.loads((out_dir / name / "metrics.json").read_text())["metrics"]
        record["metric"] = {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
    print(json.dumps(record), flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir", default=None, help="GLUE/SQuAD root (default: $FAR_DATA_DIR, else ../shared/data)"
    )
    add_output_argument(parser, results_dir(__file__), "the report's folder (memory_budget.json, README.md)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--squad-steps", type=int, default=10)
    args = parser.parse_args()
    # The data folder as far finds it, else ../shared/data beside the repository (where the project keeps it).
    data_root = resolve_data_dir(args.data_dir) or Path(__file__).resolve().parents[2] / "shared" / "data"
    cases: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        glue = data_root / "glue" / "STS-B"
        _pairs(glue / "train.tsv", tmp / "train.csv", None)
        _pairs(glue / "dev.tsv", tmp / "dev.csv", 500)
        # 32 x steps examples: every batch full, so micro-batches hold exactly the batch's examples.
        common = ["train", "--train-file", str(tmp / "train.csv"), "--validation-file", str(tmp / "dev.csv")]
        common += ["--max-length", "128", "--batch-size", "32", "--max-steps", str(args.steps)]
        common += ["--max-train-samples", str(32 * args.steps)]
        far_method = ["--method", "far", "--retention", "0.2", "--freeze-embeddings"]
        cases.append(run_far("full", [*common, "--method", "full"], tmp))
        cases.append(run_far("far", [*common, *far_method], tmp))
        for method, name in ((far_method, "far"), (["--method", "full"], "full")):
            refused = run_far(f"{name} @ 640", [*common, *method, "--memory-budget", "640"], tmp)
            cases.append(refused)
            least = refused.get("smallest_budget")
            if least is not None:
                cases.append(run_far(f"{name} @ {least}", [*common, *method, "--memory-budget", str(least)], tmp))
        squad = ["squad", "--data-dir", str(data_root), "--method", "far", "--retention", "0.2", "--freeze-embeddings"]
        squad += ["--max-steps", str(args.squad_steps), "--max-train-samples", "160", "--max-eval-samples", "100"]
        cases.append(run_far("squad far @ 1024", [*squad, "--memory-budget", "1024"], tmp))
        least = cases[-1].get("smallest_budget")
        if least is not None:
            cases.append(run_far(f"squad far @ {least}", [*squad, "--memory-budget", str(least)], tmp))
    report = {
        "machine": {**machine(), "cpu_flags": _cpu_flags()},
        "calibration": {
            "base_mib": budget.BASE_MIB,
            "activation_factor": budget.ACTIVATION_FACTOR,
            "eval_factor": budget.EVAL_FACTOR,
            "state_bytes": budget.STATE_BYTES,
        },
        "command": "python experiments/memory_budget.py " + " ".join(sys.argv[1:]),
        "cases": cases,
    }
    write_report(args.output / "memory_budget.json", report)
    lines = ["| case | plan | peak MiB | wall s | metric |", "|---|---|---|---|---|"]
    for c in cases:
        shown = c.get("refused") or c.get("plan") or "no budget"
        lines.append(f"| {c['case']} | {shown} | {c['peak_mib']} | {c['wall_s']} | {c.get('metric', '')} |")
    (args.output / "README.md").write_text(
        "# Memory budget\n\n`" + report["command"] + "`\n\n" + "\n".join(lines) + "\n\nCalibration: "
        f"{json.dumps(report['calibration'])}; CPU flags {report['machine']['cpu_flags']}.\n"
    )


if __name__ == "__main__":
    main()
