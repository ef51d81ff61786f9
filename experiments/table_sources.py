"""What the table writers share: where the result files are, how to read them, and how a table and its source line
are written (`experiments/tables.py` puts them in the documents)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "experiments" / "results"

MIB = 2**20

# The two machines of docs/results.md's "Machines" table, for result files that do not record their CPU.
MACHINE_A = "machine A (x86-64, 2 cores, native bf16), torch 2.13.0 CPU"

MACHINE_B = "machine B (AMD EPYC, 2 cores, AVX2 only), torch 2.13.0+cpu"


def load(relative: str) -> dict:
    """One committed result file, by its path under experiments/results/."""
    return json.loads((RESULTS / relative).read_text())


def machine(record: dict, default: str = "") -> str:
    """The machine a result file records (`harness.machine()`'s dict), else `default`."""
    found = record.get("machine")
    if not isinstance(found, dict) or "cpu" not in found:
        return default or "a 2-core CPU"
    flags = " ".join(found.get("cpu_flags", []))
    return f"{found.get('cpu', 'CPU')}, {found.get('cpus', '?')} cores" + (f" (`{flags}`)" if flags else "")


def source(files: list[str], made_on: str, commands: list[str]) -> str:
    """The line under a table: its files, machine and commands."""
    listed = ", ".join(f"`experiments/results/{name}`" for name in files)
    runs = "; ".join(f"`{command}`" for command in commands)
    return f"Files: {listed}. Machine: {made_on}. Command: {runs}.\n"


def pm(stat: dict, scale: float = 100.0) -> str:
    """'mean ± std' of a summary statistic, in points."""
    return f"{scale * stat['mean']:.2f} ± {scale * stat['std']:.2f}"


def signed(value: float, digits: int = 2) -> str:
    """A difference with its sign and a true minus."""
    return f"{value:+.{digits}f}".replace("-", "−")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def md_table(relative: str, index: int = 0) -> str:
    """The `index`-th markdown table of a committed .md file, verbatim."""
    blocks, current = [], []
    for line in (RESULTS / relative).read_text().splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return "\n".join(blocks[index]) + "\n"


def md_command(relative: str) -> str:
    """The command a replicate_far/bench_step .md file names on its first line."""
    first = (RESULTS / relative).read_text().splitlines()[0]
    return first.split("`")[1]


def swap_record() -> tuple[str, dict]:
    """swap_users.txt: a header (lscpu, the command) and the script's JSON."""
    text = (RESULTS / "swap_users" / "swap_users.txt").read_text()
    command = next(line for line in text.splitlines() if line.startswith("command: ")).removeprefix("command: ")
    return command, json.loads(text[text.index("\n{") + 1 :])


# SQuAD's F1 is stored in points already; the GLUE metrics as fractions.
POINTS_SCALE = {"squad": 1.0}

TASK_NAMES = {
    "cola": ("CoLA", "MCC"),
    "sst2": ("SST-2", "accuracy"),
    "stsb": ("STS-B", "Pearson"),
    "squad": ("SQuAD", "F1"),
    "mrpc": ("MRPC", "accuracy"),
    "qnli": ("QNLI", "accuracy"),
}


def constant(name: str) -> float:
    """A constant of far/selection.py, read from its text (so this script needs no torch)."""
    text = (ROOT / "far" / "selection.py").read_text()
    return float(re.search(rf"^{name} = ([0-9.]+)$", text, re.M).group(1))


def shares(values: list[float]) -> str:
    return " ".join(f"{value:.2f}" for value in values)


def params(count: int) -> str:
    """A parameter count in millions, as the tables print it (22.7M, 0.07M)."""
    return f"{count / 1e6:.{2 if count < 1e6 else 1}f}M"


def frozen_layers(run: str) -> int:
    """The depth a run froze, from its metrics.json."""
    return load(f"{run}/metrics.json")["frozen_layers"]


def rate(lr: float) -> str:
    """A learning rate as the docs write it: 3e-5, 1e-4."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{lr:.0e}")


PRECISION_NAMES = {"fp32": "fp32", "bf16": "bf16 autocast"}


def paired(config: dict) -> str:
    return f"{config['paired_ratio_median']:.3f} ({config['paired_ratio_q1']:.3f}–{config['paired_ratio_q3']:.3f})"


def mcc(run: str) -> float:
    return 100 * load(f"{run}/metrics.json")["metrics"]["matthews_correlation"]


def mean_std(values: list[float]) -> str:
    mean = sum(values) / len(values)
    std = (sum((value - mean) ** 2 for value in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.2f} ± {std:.2f}"


def md_rows(relative: str, index: int = 0) -> list[dict[str, str]]:
    """The rows of a committed .md table as dicts keyed by its header."""
    lines = md_table(relative, index).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


HEADS_RUNS = "replicate_far/replication_heads_lora/runs"


def run_result(run: str) -> tuple[float, float]:
    """A run's metric (in points) and train time (priming + training seconds), from its result.json."""
    record = load(f"{run}/result.json")
    (metric,) = record["metrics"].values()
    return 100 * metric, record["priming_seconds"] + record["training_seconds"]


def copied(relative: str, made_on: str, index: int = 0) -> Callable[[], str]:
    """A table copied from a committed .md file that names its command on its first line."""

    def write() -> str:
        return md_table(relative, index) + "\n" + source([relative], made_on, [md_command(relative)])

    return write
