"""What a training command says its steps will take, before the first, against what they took.

Each case runs `far ...` as a user types it (a fresh process, far's thread rule) and reads its log: the line
before the first step (`N steps to take: about X`, from a piece of the first step timed and undone) and the line
after the last (`the N steps took Y (estimated before the first: X)`); both count the steps' own seconds, evaluation
and checkpoints aside. The table gives X, Y and X / Y (the target: within 2x either way).

    python experiments/estimates.py --data-dir ../shared/data       # about 10 minutes on 2 idle cores
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from harness import (
    FAR,
    add_output_argument,
    command_line,
    lscpu_flags,
    machine,
    results_dir,
    user_environment,
    write_report,
)

# name -> the command's arguments after `far` (an output folder is added); samples kept small to fit a sitting.
CASES = {
    "sst2-far": "glue --task sst2 --method far --max-train-samples 1500 --epochs 1 --max-eval-samples 200",
    "sst2-far-grouped": "glue --task sst2 --method far --group-by-length --max-train-samples 1500 --epochs 1"
    " --max-eval-samples 200",
    "cola-full": "glue --task cola --method full --max-train-samples 1500 --epochs 1 --max-eval-samples 200",
    "sst2-mezo": "glue --task sst2 --method far --optimizer mezo --max-train-samples 640 --max-steps 60"
    " --max-eval-samples 200",
    "smollm2-texts": "train --model smollm2-135m --train-file docs --max-steps 6",
}
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
BEFORE = re.compile(r"(\d+) steps? to take[^:;]*: about ([\d.]+) (s|min|h)")
AFTER = re.compile(r"the (\d+) steps took ([\d.]+) (s|min|h) \(estimated before the first: ([\d.]+) (s|min|h)\)")


def seconds(value: str, unit: str) -> float:
    return float(value) * UNITS[unit]


def one_case(name: str, args: str, data_dir: str) -> dict:
    """Run one case to its end; its estimate, the steps' seconds, and the process's wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [*FAR, *args.split(), "--output-dir", str(Path(tmp) / name), "--no-progress"]
        if args.startswith("glue"):
            argv += ["--data-dir", data_dir]
        load, start = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run(
            argv, capture_output=True, text=True, env=user_environment(), cwd=Path(__file__).parents[1]
        )
        wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    before, after = BEFORE.search(done.stderr), AFTER.search(done.stderr)
    if before is None or after is None:
        raise SystemExit(f"{name}: no estimate before the first step, or no closing line:\n{done.stderr[-3000:]}")
    estimate, took = seconds(*before.group(2, 3)), seconds(*after.group(2, 3))
    lines = done.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if BEFORE.search(line))
    return {
        "case": name,
        "command": f"far {args}",
        "steps": int(before.group(1)),
        "estimate_s": estimate,
        "steps_s": took,
        "ratio": round(estimate / took, 3),
        "estimate_line": lines[first].strip(),
        "process_wall_s": round(wall, 1),
        "load_at_start": round(load, 2),
    }


def markdown(rows: list[dict]) -> str:
    out = ["| case | steps | estimated before the first | the steps took | estimate / truth |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| `{r['command']}` | {r['steps']} | {r['estimate_s']:.0f} s | {r['steps_s']:.0f} s | {r['ratio']:.2f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    add_output_argument(parser, results_dir(__file__) / "estimates" / "estimates", "the reports' path without suffix")
    args = parser.parse_args(argv)
    data_dir = str(Path(args.data_dir).resolve())
    rows = []
    for name in args.cases:
        rows.append(one_case(name, CASES[name], data_dir))
        print(rows[-1], flush=True)
    meta = {"command": command_line(__file__, argv), "machine": machine(), "cpu_flags": lscpu_flags()}
    write_report(args.output.with_suffix(".json"), {"meta": meta, "rows": rows})
    args.output.with_suffix(".md").write_text(f"`{meta['command']}`\n\n{markdown(rows)}\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
