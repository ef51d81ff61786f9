"""Choose a constant of the automatic configuration on training data held out from training, never on a dev set.

`--constant retain` (default) sets `far.selection.AUTO_RETAIN_MASS` (how much of each FFN's priming score its
learners hold), `--constant freeze` sets `AUTO_FREEZE_MASS` (how much of priming's change the frozen bottom layers may
hold, hence the depth K). Each run is `far glue ... <the automatic configuration> --validation-from-train F` in its
own process, with the constant set to one candidate value: the run trains on the rest of the training split and
reports its metric on the held-out part (seeded by --seed), the per-layer retention and the depth the rules chose.
`--full-reference` adds full fine-tuning on the same split, the metric a candidate is held to. The summary
(`<output>/<name>.{json,md}`) gives, per candidate, the held-out metric, the retention and depth chosen and the whole
process's CPU seconds. With `--full-reference` and several seeds, the rule a candidate must pass is stated before
any run: the cheapest candidate (the fewest learners, or the deepest cut) whose held-out mean over the seeds is within
1 point of full fine-tuning's mean on the same split.

    OMP_NUM_THREADS=1 python experiments/retain_mass.py --task sst2 --masses 0.2 0.35 0.5
    OMP_NUM_THREADS=1 python experiments/retain_mass.py --constant freeze --task sst2 --masses 0.4 0.55 0.7 \
        --full-reference --extra --group-by-length
    OMP_NUM_THREADS=1 python experiments/retain_mass.py --task mrpc --masses 0.5 0.65 0.8 --seeds 0 1 2 \
        --full-reference --extra-data-dir ../extra_data --extra --group-by-length --precision fp32
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import children_cpu_seconds, command_line, machine, write_report
from replicate_far import add_extra_data_argument, extra_data_folder

import far.selection

TASKS = {
    # 4,000 of SST-2's training sentences, one epoch; a quarter of the training split is held out, and its first 4,000
    # sentences score the candidates.
    "sst2": dict(
        args="--task sst2 --max-train-samples 4000 --epochs 1 --validation-from-train 0.25 --max-eval-samples 4000",
        metric="accuracy",
    ),
    "cola": dict(
        args="--task cola --max-train-samples 4000 --epochs 1 --validation-from-train 0.25 --max-eval-samples 4000",
        metric="matthews_correlation",
    ),
    # A task the constants were not chosen on, read from --extra-data-dir (replicate_far.py's new-tasks grid): all
    # 3,668 of MRPC's training pairs, one epoch, a quarter held out (917 pairs) to score the candidates. MRPC's dev
    # set, which the new-tasks table reports, plays no part.
    "mrpc": dict(
        args="--task mrpc --epochs 1 --validation-from-train 0.25 --max-eval-samples 4000",
        metric="accuracy",
        extra_data=True,
    ),
}
EVAL_ROWS = 4000  # held-out examples that score a candidate (--max-eval-samples)
# The automatic configuration: retention and depth from priming, the frozen bottom kept.
FAR_AUTO = "--method far --retention auto --freeze-embeddings --freeze-layers auto --cache-frozen"


FULL = "--method full"  # the reference (--full-reference): full fine-tuning on the same split
# --constant -> the far.selection attribute it sets, and the prefix of its runs' folders.
CONSTANTS = {"retain": ("AUTO_RETAIN_MASS", "mass"), "freeze": ("AUTO_FREEZE_MASS", "freeze")}


def run_with_mass(constant: str, mass: float, argv: list[str]) -> int:
    """`far <argv>` in this process, with the rule's constant set to `mass` (only this process sees it)."""
    from far.cli.main import main

    setattr(far.selection, CONSTANTS[constant][0], mass)
    return main(argv)


def run_dir(output: Path, task: str, constant: str, mass: float | None, seed: int) -> Path:
    name = f"{task}-full-s{seed}" if mass is None else f"{task}-{CONSTANTS[constant][1]}{mass:g}-s{seed}"
    return output / "runs" / name


def task_args(task: str, extra_data_dir: Path | None) -> list[str]:
    """`task`'s `far` arguments; a task marked `extra_data` reads its files from `extra_data_dir` (default:
    $FAR_EXTRA_DATA_DIR, else `extra_data` beside the checkout, as replicate_far.py)."""
    args = TASKS[task]["args"].split()
    if not TASKS[task].get("extra_data"):
        return args
    return [*args, "--data-dir", str(extra_data_folder(extra_data_dir))]


def one_run(
    task: str,
    constant: str,
    mass: float | None,
    seed: int,
    output: Path,
    extra: list[str],
    extra_data_dir: Path | None = None,
) -> dict:
    """One candidate's run (`mass` None: the full fine-tuning reference), or its record if it is done."""
    out = run_dir(output, task, constant, mass, seed)
    metrics_file = out / "metrics.json"
    if metrics_file.exists():
        return json.loads(metrics_file.read_text())
    method = FULL if mass is None else FAR_AUTO
    argv = ["glue", *task_args(task, extra_data_dir), *method.split(), "--seed", str(seed), "--no-save-model",
            "--no-progress", *extra, "--output-dir", str(out)]  # fmt: skip
    shown = "" if mass is None else f"{CONSTANTS[constant][0]}={mass:g} "
    print(f"$ {shown}far {' '.join(argv)}", flush=True)
    start, cpu = time.perf_counter(), children_cpu_seconds()
    value = getattr(far.selection, CONSTANTS[constant][0]) if mass is None else mass  # full reads no constant
    subprocess.run([sys.executable, __file__, "--run", constant, str(value), *argv], check=True)
    record = json.loads(metrics_file.read_text())
    record.update(process_seconds=time.perf_counter() - start, process_cpu_seconds=children_cpu_seconds() - cpu)
    metrics_file.write_text(json.dumps(record, indent=2) + "\n")
    return record


def held_out_metric(task: str, record: dict, run_dir: Path) -> float:
    """The run's metric in points, over the first EVAL_ROWS held-out examples: a run made before the candidates were
    cut to those rows evaluated on all of them, and its accuracy there is read back from its predictions."""
    metric = TASKS[task]["metric"]
    if record.get("eval_examples", 0) <= EVAL_ROWS:
        return 100 * record["metrics"][metric]
    if metric != "accuracy":
        raise ValueError(f"{run_dir} evaluated on more than {EVAL_ROWS} rows; rerun it with --max-eval-samples")
    with open(run_dir / "predictions.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))[:EVAL_ROWS]
    return 100 * sum(row["prediction"] == row["label"] for row in rows) / len(rows)


def summarize(task: str, constant: str, records: dict[float | None, list[dict]], output: Path) -> list[dict]:
    rows = []
    for mass, runs in records.items():
        values = [
            held_out_metric(task, r, run_dir(output, task, constant, mass, r["hyperparameters"]["seed"])) for r in runs
        ]
        shares = [[round(s, 3) for s in (r.get("learner_shares") or {}).values()] for r in runs]
        rows.append(
            {
                "task": task,
                "constant": CONSTANTS[constant][0],
                "mass": mass,  # None: full fine-tuning
                "held_out_metric": round(statistics.mean(values), 2),
                "per_seed": [round(v, 2) for v in values],
                "learner_shares_bottom_first": shares,
                "frozen_layers": [r.get("frozen_layers", 0) for r in runs],
                # None: a run whose driver was stopped before it could add the process's CPU seconds
                "process_cpu_seconds": [
                    None if r.get("process_cpu_seconds") is None else round(r["process_cpu_seconds"], 1) for r in runs
                ],
            }
        )
    return rows


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--run":
        sys.exit(run_with_mass(sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--constant", default="retain", choices=list(CONSTANTS), help="the constant to choose")
    parser.add_argument("--task", default="sst2", choices=list(TASKS))
    parser.add_argument("--masses", type=float, nargs="+", default=[0.2, 0.35, 0.5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "retain_mass")
    parser.add_argument("--full-reference", action="store_true", help="also run full fine-tuning on the same split")
    parser.add_argument("--name", default=None)
    add_extra_data_argument(parser, TASKS)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="further `far` arguments for every run")
    args = parser.parse_args()
    masses = [*args.masses, *([None] if args.full_reference else [])]
    records = {
        m: [
            one_run(args.task, args.constant, m, seed, args.output, args.extra, args.extra_data_dir)
            for seed in args.seeds
        ]
        for m in masses
    }
    rows = summarize(args.task, args.constant, records, args.output)
    name = args.name or (args.task if args.constant == "retain" else f"{args.task}_{args.constant}")
    write_report(
        args.output / f"{name}.json",
        {"command": command_line(__file__, sys.argv[1:]), "machine": machine(), "rows": rows},
    )
    lines = [
        "| mass | held-out metric | learner share per layer, bottom first | K | process CPU s |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        shares = " / ".join(" ".join(f"{s:.2f}" for s in seed) for seed in row["learner_shares_bottom_first"])
        mass = "full fine-tuning" if row["mass"] is None else format(row["mass"], "g")
        lines.append(
            f"| {mass} | {row['held_out_metric']:.2f} | {shares} | {row['frozen_layers']} | "
            f"{row['process_cpu_seconds']} |"
        )
    (args.output / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
