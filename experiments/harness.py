"""What the experiment scripts share: where they write, peak memory, fresh processes, the machine, their reports.

A script measures each case in a process of its own, so that no case's peak memory hides
another's: `run_case(script, argv)` runs `python <script> <argv>` and reads the JSON object that
the child prints last; the child prints it with `print_case(result)`. A script that trains through
the `far` command line runs each run with `run_far_unless_done(argv, output_dir)`: one `far`
process per run, skipped when the run's metrics.json is already there, so a grid can be resumed.

Every script writes under `experiments/results/<script>/` by default (`results_dir`), and takes the
place to write as `--output` (`add_output_argument`). Scripts import this module as
`from harness import ...` (run as `python experiments/<script>.py`, their folder is on the path).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
# The `far` command line in a fresh process of this interpreter: no PATH lookup, so the scripts
# run the `far` of the environment that runs them.
FAR = [sys.executable, "-m", "far.cli.main"]
# The CPU extensions that decide bf16 speed: bf16 products are native only with AVX-512 BF16 or AMX.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# A program that holds one core, beside a run measured on a busy machine (threads_busy.py, demo_busy.py).
BUSY_LOOP = [sys.executable, "-c", "while True: pass"]
# What sets torch's threads from outside: a run measured as a user starts it leaves them to far's rule.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "FAR_THREADS")


def user_environment() -> dict[str, str]:
    """This process's environment without `THREAD_VARIABLES`."""
    return {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}


@contextlib.contextmanager
def beside_busy_loop(busy: bool) -> Iterator[float]:
    """With `busy`, `BUSY_LOOP` running from a second before the body until after it; yields the one-minute load
    average as the body starts."""
    loop = subprocess.Popen(BUSY_LOOP) if busy else None
    try:
        if loop:
            time.sleep(1.0)
        yield os.getloadavg()[0]
    finally:
        if loop:
            loop.kill()
            loop.wait()


def results_dir(script: str | os.PathLike) -> Path:
    """`experiments/results/<script>/`, a script's default output folder (`script`: its name or its `__file__`)."""
    return RESULTS / Path(script).stem


def repo_relative(path: str | os.PathLike) -> str:
    """A path as the repository root sees it, for help texts (scripts are run from there); others unchanged."""
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)


def add_output_argument(
    parser: argparse.ArgumentParser, default: Path | None, help: str, *, aliases: tuple[str, ...] = ()
) -> None:
    """The one output flag, `--output`; `aliases` are other names of it, accepted but left out of --help."""
    shown = "" if default is None else f" (default: {repo_relative(default)})"
    parser.add_argument("--output", type=Path, default=default, help=help + shown)
    for alias in aliases:
        # default=SUPPRESS: the alias must not overwrite --output's default when it is not given.
        parser.add_argument(alias, dest="output", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def command_line(script: str | os.PathLike, argv: list[str] | None) -> str:
    """The command that ran a script, as its report records it (`argv` None: this process's arguments)."""
    return " ".join(["python", f"experiments/{Path(script).name}", *(sys.argv[1:] if argv is None else argv)])


def peak_rss_bytes() -> int:
    """The process's peak resident set so far: VmHWM on Linux (reset by `reset_peak_rss`), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), to measure one phase of a case apart."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's finished children: a load-independent measure of their work."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def print_case(result: dict) -> None:
    """What a child process reports: one JSON line, the last it prints."""
    print(json.dumps(result), flush=True)


def start_case(script: str | os.PathLike, argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start `python script *argv` in a fresh process; `case_result` waits for it (cases may run side by side)."""
    command = [sys.executable, str(script), *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def case_result(process: subprocess.Popen) -> dict:
    """Wait for a started case and return the JSON object it printed last.

    Raises:
        RuntimeError: the child failed; the message ends with its stderr.
    """
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, process.args[1:]))} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_case(script: str | os.PathLike, argv: list[str], env: dict | None = None) -> dict:
    """Run one case in a fresh process, to its end, and return what it reported."""
    return case_result(start_case(script, argv, env))


def run_far(argv: list[str], output_dir: str | os.PathLike, *, quiet: bool = False) -> dict:
    """Run `far <argv> --output-dir <output_dir>` in a fresh process, to its end, and return its metrics.json.

    One process per run, so that one run's memory and threads cannot leak into the next. The record
    (and the metrics.json) gains the whole process's wall seconds and CPU seconds: unlike wall time,
    CPU seconds barely move when other processes compete for the cores, so runs made at different
    times still compare. `quiet` keeps the run's output off the terminal.

    Raises:
        subprocess.CalledProcessError: the run failed.
    """
    output_dir = Path(output_dir)
    argv = [*map(str, argv), "--output-dir", str(output_dir)]
    print(f"$ far {' '.join(argv)}", flush=True)
    start, cpu_start = time.perf_counter(), children_cpu_seconds()
    subprocess.run([*FAR, *argv], check=True, capture_output=quiet)
    metrics_file = output_dir / "metrics.json"
    record = json.loads(metrics_file.read_text())
    record["process_seconds"] = time.perf_counter() - start
    record["process_cpu_seconds"] = children_cpu_seconds() - cpu_start
    metrics_file.write_text(json.dumps(record, indent=2) + "\n")
    return record


def run_far_unless_done(argv: list[str], output_dir: str | os.PathLike) -> dict:
    """`run_far`, unless `<output_dir>/metrics.json` exists: then that finished run's record, run again never.

    A finished run is not redone, so a grid stopped halfway resumes where it stopped.
    """
    metrics_file = Path(output_dir) / "metrics.json"
    if metrics_file.exists():
        return json.loads(metrics_file.read_text())
    return run_far(argv, output_dir)


def peak_rss_mib(time_v_stderr: str) -> float:
    """A process's whole peak RSS in MiB, from the report `/usr/bin/time -v` wrote to its stderr."""
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_v_stderr).group(1))
    return round(kib / 1024, 1)


def cpu() -> dict:
    """The CPU model and which of `CPU_FLAGS` it has, from /proc/cpuinfo (elsewhere: the platform's word, no flags)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"cpu": model or platform.processor(), "cpu_flags": [flag for flag in CPU_FLAGS if flag in flags]}


def lscpu_flags() -> str:
    """The `Flags:` line of lscpu (every flag), or "" where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Flags")), "")


def machine() -> dict:
    """What a benchmark ran on: core count, OS, Python, the CPU model and its bf16-relevant extensions."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(), **cpu()}


def write_report(path: str | os.PathLike, report: dict | list) -> Path:
    """Write a script's JSON report (parents created) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return path
