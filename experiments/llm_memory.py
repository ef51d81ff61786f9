"""Whole-process peak memory of `far glue` with a GGUF causal LM on the lean runtime: one process per case.

Each case is the `far` command a user types (or, for inference, the same run with no training
step), measured by `/usr/bin/time -v` ("Maximum resident set size": the whole process, imports,
tokenizer, data, weights, activations, MeZO). The run's own `memory_phases` (resident memory
after each phase, from metrics.json) give the budget line by line. `--output` is the report's path
without .json; a report that exists gains the cases run (default experiments/results/llm_memory/llm_memory_smollm2).

    python experiments/llm_memory.py                         # SmolLM2-135M: MeZO+FAR, plain MeZO, inference
    python experiments/llm_memory.py --model gemma3-270m --output experiments/results/llm_memory/llm_memory_gemma3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import FAR, add_output_argument, machine, peak_rss_mib, results_dir, write_report

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
EVAL_ONLY = (
    "import sys; from far.cli.common import settings_from; from far.cli.main import build_parser; "
    "from far.recipes.causal_lm import lean_prompted_run; "
    "args = build_parser('glue').parse_args(sys.argv[1:]); "
    "lean_prompted_run(settings_from(args), args.task, train=False)"
)


def cases(model: str, steps: int, eval_samples: int) -> dict[str, list[str]]:
    common = ["--task", "sst2", "--model", model, "--optimizer", "mezo", "--max-steps", str(steps)]
    common += ["--max-eval-samples", str(eval_samples)]
    return {
        "mezo+far r=0.4": [*common, "--method", "far", "--retention", "0.4"],
        "mezo (plain)": [*common, "--method", "full"],
        "inference": [*common, "--method", "full", "--eval-only"],
        "mezo+far r=0.4, fp32 learners": [
            *common,
            "--method",
            "far",
            "--retention",
            "0.4",
            "--trainable-dtype",
            "float32",
        ],
    }


def run(argv: list[str], output_dir: Path) -> dict:
    eval_only = "--eval-only" in argv
    argv = [a for a in argv if a != "--eval-only"] + ["--output-dir", str(output_dir), "--no-progress"]
    python = [sys.executable, "-c", EVAL_ONLY, "glue"] if eval_only else [*FAR, "glue"]
    command = ["/usr/bin/time", "-v", *python, *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr).group(1)
    record = json.loads((output_dir / "metrics.json").read_text())
    return {
        "command": "far glue "
        + " ".join(argv[: argv.index("--output-dir")])
        + (" (evaluation only)" if eval_only else ""),
        "peak_rss_mib": peak_rss_mib(done.stderr),
        "wall": wall,
        "accuracy": record["metrics"]["accuracy"],
        "trainable_parameters": record["trainable_parameters"],
        "total_parameters": record["total_parameters"],
        "median_step_seconds": record["median_step_seconds"],
        "memory_phases": record["memory_phases"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=64)
    parser.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    add_output_argument(parser, results_dir(__file__) / "llm_memory_smollm2", "the report's path without .json")
    args = parser.parse_args()
    chosen = cases(args.model, args.steps, args.eval_samples)
    names = args.cases or list(chosen)
    output = ROOT / f"{args.output}.json"
    report = json.loads(output.read_text()) if output.is_file() else {"cases": {}}
    report["machine"] = machine()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(chosen[name], Path(tmp) / "run")
        report["cases"][name] = result
        print(f"{name}: {result['peak_rss_mib']:,.0f} MiB peak, accuracy {result['accuracy']:.3f}", flush=True)
        write_report(output, report)  # after every case: a stopped run keeps the cases it measured


if __name__ == "__main__":
    main()
