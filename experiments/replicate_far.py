"""The FAR paper's comparison, on our hardware: full fine-tuning vs FAR vs random vs freeze-FFN.

Every run is one `far glue` / `far squad` command in its own process (harness.run_far_unless_done: one
run's memory and threads cannot leak into the next), interleaved seed by seed so that slow drift of the
machine hits all methods alike. Each run's metrics.json stays under `<output>/runs/` (default output:
experiments/results/replicate_far/); the summary (mean ± std over seeds of the task metric and of the
wall time) goes to `<output>/replication.{json,md}` (`--name` changes the stem), with each
method's whole-process peak RSS (the run's own `peak_rss_bytes`) and, with `--kept-files`, the size of the
file a user keeps per task (measured once per task and method by a short run that saves: the LoRA
adapter, FAR's learners file, or the whole model).

    python experiments/replicate_far.py                              # the committed grid (~3 h on 2 cores)
    python experiments/replicate_far.py --tasks cola --seeds 0       # the headline task, one seed
    python experiments/replicate_far.py --quick                      # a smoke run: tiny subsets
    python experiments/replicate_far.py --tasks mrpc qnli --methods full far-default \
        --extra-data-dir ../extra_data   # tasks FAR's automatic configuration was not chosen on
    python experiments/replicate_far.py --methods full far lora --name replication_lora \
        --output experiments/results/replicate_far/replication_lora --earlier-runs experiments/results/replicate_far
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness import add_output_argument, command_line, machine, results_dir, run_far, run_far_unless_done, write_report

# The headline metric of each task and the command-line settings of its runs. Subsets are
# documented here because they are what makes the grid fit a 2-core CPU.
TASKS: dict[str, dict] = {
    "cola": dict(metric="matthews_correlation", seeds=[0, 1, 2], args=["glue", "--task", "cola"]),
    "sst2": dict(
        metric="accuracy", seeds=[0], args=["glue", "--task", "sst2", "--max-train-samples", "8000", "--epochs", "1"]
    ),
    "stsb": dict(metric="pearson", seeds=[0], args=["glue", "--task", "stsb"]),
    # SQuAD: the dev file split by article (no article on both sides); 2,000 training questions, 1 epoch, windows
    # of 256 tokens (a 384-token step costs ~4 s on 2 cores), a higher lr for so few steps, 800 held-out questions.
    "squad": dict(
        metric="f1",
        seeds=[0, 1],
        points=1,  # SQuAD's F1 is already in points
        args="squad --max-train-samples 2000 --epochs 1 --max-length 256 --doc-stride 96 --lr 1e-4 "
        "--max-eval-samples 800".split(),
    ),
    # Two tasks FAR's automatic configuration was not chosen on, read from --extra-data-dir (not the shared data;
    # its README.md gives the files' provenance), one epoch each so that 3 seeds of both arms fit a shared 2-core
    # machine in an hour and a half. MRPC: GLUE's split, all 3,668 pairs. QNLI: GLUE's training file (28 MB) could
    # not be had, so GLUE's dev file split by SQuAD article: the first 1,400 of the 2,796 training rows, all 2,667
    # held-out rows to evaluate on.
    "mrpc": dict(metric="accuracy", seeds=[0, 1, 2], extra_data=True, args="glue --task mrpc --epochs 1".split()),
    "qnli": dict(
        metric="accuracy",
        seeds=[0, 1, 2],
        extra_data=True,
        args="glue --task qnli --epochs 1 --max-train-samples 1400".split(),
    ),
}
# Where the `extra_data` tasks' files are: glue/<Task>/{train,dev}.tsv, beside the project's shared data.
EXTRA_DATA_ENV = "FAR_EXTRA_DATA_DIR"
DEFAULT_EXTRA_DATA = Path(__file__).resolve().parents[1].parent / "extra_data"
# FAR r=0.2 with frozen embeddings (portable files at no cost, docs/results.md) and further `far` flags.
FAR_02 = ["--method", "far", "--retention", "0.2", "--freeze-embeddings"]
# FAR with the retention chosen from priming and frozen embeddings: the automatic configuration's base.
FAR_AUTO_RETENTION = ["--method", "far", "--retention", "auto", "--freeze-embeddings"]
# The FAR paper's configuration (`--preset paper`: retention 0.4 in every FFN, nothing else frozen), which `far`
# runs only when asked: `--method far` alone is the automatic configuration ("far-default").
FAR_PAPER = ["--method", "far", "--preset", "paper"]
# name -> extra `far` arguments. The first four are the paper's comparison; the rest probe what it
# takes to reach the paper's 30% time saving.
METHODS: dict[str, list[str]] = {
    "full": ["--method", "full"],
    "far": FAR_PAPER,
    "random": ["--method", "random", "--retention", "0.4"],
    "freeze-ffn": ["--method", "freeze-ffn"],
    # What `far glue --method far` runs with no other flag: FAR's automatic configuration.
    "far-default": ["--method", "far"],
    "far+frozen-emb": [*FAR_PAPER, "--freeze-embeddings"],
    "far-0.2+frozen-emb": FAR_02,
    "far-0.4-priming-0.05": [*FAR_PAPER, "--priming", "0.05"],
    # Attention heads split too (FFN retention, head retention).
    "far+heads-0.4": [*FAR_PAPER, "--attention-retention", "0.4"],
    "far-0.2+heads-0.2+frozen-emb": [*FAR_02, "--attention-retention", "0.2"],
    # The baselines a practitioner tries first, and FAR with depth: backward stops at the lowest trainable layer.
    "full+frozen-emb": ["--method", "full", "--freeze-embeddings"],
    "full+frozen-bottom-2": ["--method", "full", "--freeze-layers", "2"],
    "full+frozen-bottom-3": ["--method", "full", "--freeze-layers", "3"],
    "far-0.2+frozen-emb+bottom-2": [*FAR_02, "--freeze-layers", "2"],
    "far-0.2+frozen-emb+bottom-3": [*FAR_02, "--freeze-layers", "3"],
    "far-0.2+depth-auto": [*FAR_02, "--freeze-layers", "auto"],
    # The frozen bottom run once per example and kept (--cache-frozen): later epochs run the layers above it only.
    "full+frozen-bottom-2+cache": ["--method", "full", "--freeze-layers", "2", "--cache-frozen"],
    "far-0.2+depth-auto+cache": [*FAR_02, "--freeze-layers", "auto", "--cache-frozen"],
    # Priming by gradients over the first 16 batches, with no update (--priming-scores gradient), and the retention
    # chosen per layer from the priming scores (--retention auto).
    "far-0.2+depth-auto+cache+gradient-16": [
        *FAR_02,
        "--freeze-layers",
        "auto",
        "--cache-frozen",
        "--priming-scores",
        "gradient",
        "--priming",
        "16",
    ],
    "far-auto+depth-auto+cache": [*FAR_AUTO_RETENTION, "--freeze-layers", "auto", "--cache-frozen"],
    "far-auto+depth-auto+cache+gradient-16": [
        *FAR_AUTO_RETENTION,
        "--freeze-layers",
        "auto",
        "--cache-frozen",
        "--priming-scores",
        "gradient",
        "--priming",
        "16",
    ],
    # The automatic configuration primed on 5% of the steps instead of 10%: priming runs the whole model.
    "far-auto+depth-auto+cache+priming-0.05": [
        *FAR_AUTO_RETENTION,
        "--freeze-layers",
        "auto",
        "--cache-frozen",
        "--priming",
        "0.05",
    ],
    # The automatic retention at a depth given by hand: what `auto` depth chooses on MiniLM's tasks with
    # AUTO_FREEZE_MASS 0.25 (K=1), 0.4 (K=2) and 0.55 (K=3).
    "far-auto+depth-1+cache": [*FAR_AUTO_RETENTION, "--freeze-layers", "1", "--cache-frozen"],
    "far-auto+depth-3+cache": [*FAR_AUTO_RETENTION, "--freeze-layers", "3", "--cache-frozen"],
    "far-0.2+frozen-emb+bottom-2+cache": [*FAR_02, "--freeze-layers", "2", "--cache-frozen"],
    "full+frozen-bottom-3+cache": ["--method", "full", "--freeze-layers", "3", "--cache-frozen"],
    "far-0.2+frozen-emb+bottom-3+cache": [*FAR_02, "--freeze-layers", "3", "--cache-frozen"],
    # What portable files cost: the frozen nodes and embeddings keep their primed values instead.
    "far-0.2+frozen-emb+keep-primed": [*FAR_02, "--keep-primed-frozen"],
    # PEFT's LoRA defaults (r=8, alpha 8, query and value); its learning rate is experiments/lr_sweep.py's choice.
    "lora": ["--method", "lora", "--lr", "0.008"],
    # CoLA's 3 epochs at 8e-3 collapsed to the majority class (MCC 0); CoLA's own short sweep ranked no rate, and
    # 2e-3 had the lowest training loss there.
    "lora-lr2e-3": ["--method", "lora", "--lr", "0.002"],
}
PAPER_METHODS = ["full", "far", "random", "freeze-ffn"]


def method_args(name: str) -> list[str]:
    """A named method's arguments; `far-r<R>` is FAR at retention R (for retention sweeps)."""
    if name in METHODS:
        return METHODS[name]
    if name.startswith("far-r"):
        return ["--method", "far", "--retention", name.removeprefix("far-r")]
    raise ValueError(f"unknown method {name!r}: one of {', '.join(METHODS)}, or far-r<retention> (e.g. far-r0.3)")


QUICK_ARGS = ["--max-train-samples", "64", "--max-eval-samples", "64", "--max-steps", "4"]


# A record taken from another grid's folder names that folder under `from_grid`; the committed summaries under
# experiments/results/replicate_far spell the same mark as the second key, which is read too.
OTHER_GRID_KEYS = ("from_grid", "earlier_session")


def from_grid(record: dict) -> str | None:
    """The folder of the other grid that `record` was taken from; None for a run of this grid."""
    return next((record[key] for key in OTHER_GRID_KEYS if record.get(key)), None)


def task_args(task: str, extra_data_dir: Path | None = None) -> list[str]:
    """`task`'s `far` arguments; a task marked `extra_data` reads its files from `extra_data_dir` (default:
    $FAR_EXTRA_DATA_DIR, else `extra_data` beside the checkout)."""
    spec = TASKS[task]
    if not spec.get("extra_data"):
        return spec["args"]
    return [*spec["args"], "--data-dir", str(extra_data_folder(extra_data_dir))]


def extra_data_folder(extra_data_dir: Path | None = None) -> Path:
    """Where the `extra_data` tasks' files are: `extra_data_dir`, else $FAR_EXTRA_DATA_DIR, else `extra_data` beside
    the checkout."""
    return extra_data_dir or Path(os.environ.get(EXTRA_DATA_ENV) or DEFAULT_EXTRA_DATA)


def add_extra_data_argument(parser: argparse.ArgumentParser, tasks: dict[str, dict]) -> None:
    """`--extra-data-dir`, the data root of those of `tasks` marked `extra_data` (`extra_data_folder`)."""
    parser.add_argument(
        "--extra-data-dir",
        type=Path,
        default=None,
        help=f"data root (glue/<Task>/) of {', '.join(t for t, spec in tasks.items() if spec.get('extra_data'))} "
        f"(default: ${EXTRA_DATA_ENV}, else {DEFAULT_EXTRA_DATA.name}/ beside the checkout)",
    )


def run_one(
    task: str,
    method: str,
    seed: int,
    runs_dir: Path,
    extra: list[str],
    quick: bool,
    other_grids: Sequence[Path] = (),
    extra_data_dir: Path | None = None,
) -> dict:
    """One run of the grid: this grid's own if it finished, else one of `other_grids`' (the first folder that has
    it), else run now (with its whole process's wall and CPU seconds, see harness.run_far)."""
    out = runs_dir / f"{task}-{method}-s{seed}"
    if not (out / "metrics.json").exists():  # this grid's own finished run comes first
        for folder in other_grids:
            other_file = folder / "runs" / out.name / "metrics.json"
            if other_file.exists():
                # Another grid's run: its metric stands, its times were taken under another machine load.
                return {**json.loads(other_file.read_text()), "from_grid": str(folder)}
    argv = [
        *task_args(task, extra_data_dir), *method_args(method), "--seed", str(seed), "--no-save-model", "--no-progress",
        *extra, *(QUICK_ARGS if quick else []),
    ]  # fmt: skip
    return run_far_unless_done(argv, out)


# What a run of each `--method` leaves for the user to keep per task; the others keep the whole model.
KEPT_FILES = {
    "lora": "adapter/adapter_model.safetensors",
    "far": "learners.safetensors",
    "random": "learners.safetensors",
}


KEPT_FILE_TASK = "cola"


def kept_file_bytes(method: str, output: Path) -> dict:
    """The file a user keeps per task after training with `method`: measured once by a 4-step CoLA run that saves.

    LoRA keeps its adapter, FAR (and random) its learners file, the others the whole model. The size does not
    depend on how long the run trained, and another task's head changes it by a few KB at most (MiniLM: 384
    weights per output). Cached in `<output>/kept_files.json`.
    """
    cache = output / "kept_files.json"
    sizes = json.loads(cache.read_text()) if cache.exists() else {}
    if method not in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [*TASKS[KEPT_FILE_TASK]["args"], *method_args(method), "--no-progress", *QUICK_ARGS]
            run_far(argv, tmp, quiet=True)
            args = method_args(method)
            kept = KEPT_FILES.get(args[args.index("--method") + 1], "model/model.safetensors")
            sizes[method] = {"file": kept, "bytes": (Path(tmp) / kept).stat().st_size, "task": KEPT_FILE_TASK}
        output.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(sizes, indent=2) + "\n")
    return sizes[method]


def _mean_std(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
        "values": values,
    }


def summarize(records: dict[tuple[str, str, int], dict]) -> dict:
    summary: dict[str, dict] = {}
    for (task, method, _), record in records.items():
        row = summary.setdefault(task, {}).setdefault(method, {"metric": [], "train_seconds": [], "total_seconds": []})
        row["metric"].append(record["metrics"][TASKS[task]["metric"]])
        # End to end: priming (with the surgery) + training; evaluation is the same for every method. Times of
        # this grid's own runs and of runs taken from other grids are kept apart: only one kind makes the row's
        # times (wall and whole-process CPU seconds alike: another grid may have run on other cores and threads).
        other = from_grid(record)
        times = row.setdefault("other_grid_times" if other else "own_times", [])
        train = record["priming_seconds"] + record["training_seconds"]
        times.append((train, record["total_seconds"], record.get("process_cpu_seconds")))
        row["trainable_parameters"] = record["trainable_parameters"]
        row.setdefault("peak_rss_bytes", []).append(record.get("peak_rss_bytes"))
        if other:
            row["from_grid"] = other
    for methods in summary.values():
        for row in methods.values():
            times = row.pop("own_times", None)
            if times is None:  # only runs taken from other grids: their times, marked
                times, row["times_from"] = row["other_grid_times"], row["from_grid"]
            row.pop("other_grid_times", None)
            row["train_seconds"] = [train for train, _, _ in times]
            row["total_seconds"] = [total for _, total, _ in times]
            cpu = [seconds for _, _, seconds in times]
            for key in ("metric", "train_seconds", "total_seconds"):
                row[key] = _mean_std(row[key])
            rss = [b for b in row["peak_rss_bytes"] if b is not None]
            row["peak_rss_bytes"] = max(rss) if rss else None
            if cpu and None not in cpu:  # whole-process CPU seconds, where every run recorded them
                row["process_cpu_seconds"] = _mean_std(cpu)
        full = methods.get("full")  # deltas once every row is summarized, whatever the methods' order
        for row in methods.values():
            if full:
                row["metric_delta_vs_full"] = row["metric"]["mean"] - full["metric"]["mean"]
                if bool(row.get("times_from")) != bool(full.get("times_from")):
                    continue  # savings compare times of one kind only: this grid's own, or other grids'
                row["time_saving_vs_full"] = 1 - row["train_seconds"]["mean"] / full["train_seconds"]["mean"]
                if "process_cpu_seconds" in row and "process_cpu_seconds" in full:
                    mean = row["process_cpu_seconds"]["mean"]
                    row["cpu_saving_vs_full"] = 1 - mean / full["process_cpu_seconds"]["mean"]
    return summary


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:,.1f}"


def markdown(summary: dict, kept: dict | None = None) -> str:
    """The summary as a table; times of runs taken from other grids are marked †, and `kept` (method ->
    {"bytes": ...}) adds the kept file's size."""
    lines = [
        "| task | metric | method | metric (mean ± std) | Δ vs full | train time s (mean ± std) | time saved vs full "
        "| process CPU s | CPU saved vs full | seeds | trainable params | peak RSS MiB (max) | kept file MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, methods in summary.items():
        for method, row in methods.items():
            m, t = row["metric"], row["train_seconds"]
            scale = TASKS[task].get("points", 100)  # metrics as points
            delta = row.get("metric_delta_vs_full")
            saving = row.get("time_saving_vs_full")
            cpu, cpu_saving = row.get("process_cpu_seconds"), row.get("cpu_saving_vs_full")
            marked = " †" if row.get("times_from") else ""
            cpu_time = "" if cpu is None else f"{cpu['mean']:.0f} ± {cpu['std']:.0f}{marked}"
            cpu_cells = f"{cpu_time} | {'' if cpu_saving is None else f'{100 * cpu_saving:.1f}%'}"
            lines.append(
                f"| {task} | {TASKS[task]['metric']} | {method} | {scale * m['mean']:.2f} ± {scale * m['std']:.2f} | "
                f"{'' if delta is None else f'{scale * delta:+.2f}'} | {t['mean']:.0f} ± {t['std']:.0f}"
                f"{marked} | {'' if saving is None else f'{100 * saving:.1f}%'} | "
                f"{cpu_cells} | {m['n']} | {row['trainable_parameters']:,} | {_mib(row.get('peak_rss_bytes'))} | "
                f"{_mib((kept or {}).get(method, {}).get('bytes'))} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=[task for task, spec in TASKS.items() if not spec.get("extra_data")],
        choices=list(TASKS),
        help="default: every task but those read from --extra-data-dir",
    )
    parser.add_argument("--methods", nargs="+", default=PAPER_METHODS, help=f"of {', '.join(METHODS)}, or far-r<R>")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="seeds for every task (default: each task's own: "
        + ", ".join(f"{task} {' '.join(map(str, spec['seeds']))}" for task, spec in TASKS.items())
        + ")",
    )
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="further `far` arguments for every run")
    parser.add_argument("--quick", action="store_true", help="tiny subsets and 4 steps: checks the pipeline only")
    parser.add_argument(
        "--earlier-runs",
        type=Path,
        nargs="+",
        default=[],
        help="other grids' output folders: their runs stand in for this grid's missing ones (metrics and memory; "
        "times marked †); the first folder that has a run gives it",
    )
    parser.add_argument(
        "--kept-files", action="store_true", help="also measure the file a user keeps, per method (on CoLA)"
    )
    parser.add_argument(
        "--summarize-only", action="store_true", help="summarize the runs there are; run none that is missing"
    )
    add_extra_data_argument(parser, TASKS)
    add_output_argument(parser, results_dir(__file__), "the grid's folder: runs/ and the summary")
    parser.add_argument(
        "--name", default="replication", help="summary file stem: grids with other methods share <output>/runs"
    )
    args = parser.parse_args(argv)
    for method in args.methods:
        method_args(method)  # an unknown name fails now, not hours into the grid

    records = {}
    command = command_line(__file__, argv)
    for task in args.tasks:
        seeds = args.seeds or TASKS[task]["seeds"]
        for seed in seeds:
            for method in args.methods:
                if args.summarize_only and not any(
                    (folder / "runs" / f"{task}-{method}-s{seed}" / "metrics.json").exists()
                    for folder in (args.output, *args.earlier_runs)
                ):
                    continue
                records[(task, method, seed)] = run_one(
                    task,
                    method,
                    seed,
                    args.output / "runs",
                    args.extra,
                    args.quick,
                    args.earlier_runs,
                    args.extra_data_dir,
                )
                # after every run: a stopped grid keeps its results
                write_summary(records, args.output, args.name, command)
    if args.kept_files:
        kept = {m: kept_file_bytes(m, args.output) for _, m, _ in records}
        write_summary(records, args.output, args.name, command, kept)


TIMES_NOTE = (
    "† times of runs taken from other grids (`--earlier-runs`): their metric and memory stand, but their time was "
    "taken under another machine load; times compare only among marked or among unmarked rows (a row with runs of "
    "both kinds shows this grid's own times; its seeds count all runs), and no saving is given across the two."
)


def write_summary(records: dict, output: Path, name: str, command: str, kept: dict | None = None) -> None:
    summary = summarize(records)
    body = {"command": command, "summary": summary, "kept_files": kept, "machine": machine()}
    write_report(output / f"{name}.json", body)
    table = markdown(summary, kept)
    note = f"\n\n{TIMES_NOTE}" if any(from_grid(r) for r in records.values()) else ""
    (output / f"{name}.md").write_text(f"`{command}`\n\n{table}{note}\n")
    print(table, flush=True)


if __name__ == "__main__":
    main()
