"""What the experiment scripts share: peak memory, one fresh process per case, and their reports.

A script measures each case in a process of its own, so that no case's peak memory hides
another's: `run_case(script, argv)` runs `python <script> <argv>` and reads the JSON object that
the child prints last; the child prints it with `print_case(result)`. Scripts import this module
as `from harness import ...` (run as `python experiments/<script>.py`, their folder is on the path).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path


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


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def write_report(path: str | os.PathLike, report: dict) -> Path:
    """Write a script's JSON report (parents created) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return path
