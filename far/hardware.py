"""The machine's facts that runs read: what its CPU computes natively, how many cores are free, its memory peak.

torch is imported by `native_bf16` alone: `fit_threads` must run before torch loads its OpenMP runtime, which
reads the thread count and the wait policy from the environment once, when it loads.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass

# The user's say over the thread count: far's own variable, then OpenMP's (which torch reads).
THREADS_ENV = "FAR_THREADS"
OMP_THREADS_ENV = "OMP_NUM_THREADS"
OMP_WAIT_ENV = "OMP_WAIT_POLICY"
# How long the cores' load is sampled at start-up: long enough to see a busy program, short beside any run.
LOAD_SAMPLE_S = 0.1


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX-512 BF16 or AMX), by torch's own check."""
    import torch  # here, not at the top: see the module's docstring

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def peak_rss_bytes() -> int:
    """This process's peak resident memory in bytes.

    On Linux, `VmHWM` of /proc/self/status: `ru_maxrss` there carries the peak of the process a run was forked
    from over its `exec` (a test suite, a notebook). Elsewhere `ru_maxrss` (bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def allowed_cores() -> int:
    """How many cores this process may run on (its affinity, which a container or `taskset` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_jiffies(cpus: set[int]) -> tuple[int, int]:
    """(busy, total) clock ticks of `cpus` since boot, from /proc/stat's `cpuN` lines."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_cores(seconds: float = LOAD_SAMPLE_S) -> float:
    """How many of this process's cores other programs keep busy: sampled from /proc/stat over `seconds` where
    there is one (Linux), the one-minute load average elsewhere (slower to see a program that has just started)."""
    if not (os.path.exists("/proc/stat") and hasattr(os, "sched_getaffinity")):
        return min(os.getloadavg()[0], float(allowed_cores()))
    cpus = os.sched_getaffinity(0)
    busy0, total0 = _cpu_jiffies(cpus)
    time.sleep(seconds)
    busy1, total1 = _cpu_jiffies(cpus)
    return len(cpus) * (busy1 - busy0) / max(total1 - total0, 1)


@dataclass(frozen=True)
class ThreadPlan:
    """How many threads torch computes with, how idle ones wait, and why (for the log)."""

    threads: int
    wait_policy: str
    reason: str


def _threads_from(name: str, value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(
            f"{name}={value!r} is not a thread count: set it to a whole number of at least 1, "
            f"or unset it to let far use the cores that are free"
        )
    return int(value)


def plan_threads(environ: MutableMapping[str, str] = os.environ, busy: float | None = None) -> ThreadPlan:
    """The threads a run computes with: `FAR_THREADS`, else `OMP_NUM_THREADS`, else one per free core.

    A core is free unless other programs keep more than half of it busy (sampled at start-up): a thread on a busy
    core would hold up every other thread. Idle threads wait passively (`OMP_WAIT_POLICY=PASSIVE`, unless set), so
    they do not spin on a core a program started later needs. `busy`: the cores other programs keep busy
    (default: sampled by `busy_cores`).

    >>> plan_threads({}, busy=1.0)  # on 2 cores
    ThreadPlan(threads=1, wait_policy='PASSIVE', reason='1 of 2 cores free')
    """
    policy = environ.get(OMP_WAIT_ENV) or "PASSIVE"
    for name in (THREADS_ENV, OMP_THREADS_ENV):
        if environ.get(name):
            return ThreadPlan(_threads_from(name, environ[name]), policy, f"{name}={environ[name]}")
    cores = allowed_cores()
    busy = busy_cores() if busy is None else busy
    free = max(1, cores - math.floor(busy + 0.5))
    return ThreadPlan(free, policy, f"{free} of {cores} cores free")


def fit_threads(environ: MutableMapping[str, str] = os.environ) -> ThreadPlan | None:
    """Set `plan_threads`'s count and wait policy for torch, which reads them once when it loads: the plan set, or
    None where torch is loaded already (a host program, a test), whose threads are left as they are."""
    if "torch" in sys.modules:
        return None
    plan = plan_threads(environ)
    environ[OMP_THREADS_ENV] = str(plan.threads)
    environ[OMP_WAIT_ENV] = plan.wait_policy
    return plan
