"""The machine's facts: threads from the free cores and how they wait, the peak-memory reading."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from far import hardware
from far.cli.main import main
from far.hardware import ThreadPlan, fit_threads, plan_threads


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(hardware, "allowed_cores", lambda: 2)


@pytest.mark.parametrize(
    "busy, threads",
    [(0.0, 2), (0.3, 2), (0.6, 1), (1.0, 1), (1.4, 1), (2.0, 1)],
)
def test_one_thread_per_free_core_and_never_none(two_cores, busy, threads):
    assert plan_threads({}, busy=busy) == ThreadPlan(threads, "PASSIVE", f"{threads} of 2 cores free")


def test_the_users_count_and_wait_policy_win(two_cores):
    assert plan_threads({"OMP_NUM_THREADS": "2"}, busy=1.0) == ThreadPlan(2, "PASSIVE", "OMP_NUM_THREADS=2")
    both = {"FAR_THREADS": "3", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    assert plan_threads(both, busy=0.0) == ThreadPlan(3, "ACTIVE", "FAR_THREADS=3")


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_count_is_refused_with_what_to_do(value):
    with pytest.raises(ValueError, match=rf"FAR_THREADS='{value}' is not a thread count: set it to a whole number"):
        plan_threads({"FAR_THREADS": value}, busy=0.0)


def test_far_refuses_a_bad_count_before_it_runs(monkeypatch, capsys):
    monkeypatch.setenv("FAR_THREADS", "many")
    monkeypatch.delitem(sys.modules, "torch")  # as in a fresh `far` process, where torch is not loaded yet
    assert main(["glue", "--task", "sst2"]) == 2
    assert "far: error: FAR_THREADS='many' is not a thread count" in capsys.readouterr().err


def test_a_loaded_torch_is_left_as_it_is():
    environ = {}
    assert "torch" in sys.modules and fit_threads(environ) is None and environ == {}


def test_the_busy_cores_are_measured_in_range():
    assert 0.0 <= hardware.busy_cores(0.02) <= hardware.allowed_cores()


def test_peak_rss_is_in_bytes():
    assert 10 * 2**20 < hardware.peak_rss_bytes() < 64 * 2**30  # a Python process with torch: tens of MiB at least


# Threads that wait after a parallel product while the main thread sleeps burn CPU only if they spin.
SLEEP_AFTER_WORK = textwrap.dedent(
    """
    import resource, time
    from far.hardware import fit_threads
    fit_threads()
    import torch
    torch.set_num_threads(2)
    x = torch.randn(1500, 1500)
    for _ in range(3):
        (x @ x).sum()
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(0.3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(hardware.allowed_cores() < 2, reason="needs two cores for a second thread")
def test_idle_threads_sleep_once_torch_has_loaded():
    def cpu_while_asleep(**env: str) -> float:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")} | env
        done = subprocess.run([sys.executable, "-c", SLEEP_AFTER_WORK], env=environ, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout)

    assert cpu_while_asleep(FAR_THREADS="2") < 0.05  # passive: the second thread sleeps
    assert cpu_while_asleep(FAR_THREADS="2", OMP_WAIT_POLICY="ACTIVE") > 0.1  # the check can fail: spinning shows


def test_a_child_reports_its_own_peak_not_its_parents():
    """A run started from a large process (a test suite, a notebook) measures its own memory, not its parent's."""
    ballast = bytearray(400 * 2**20)  # 400 MiB, touched: resident in this process
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    code = "from far.hardware import peak_rss_bytes; print(peak_rss_bytes())"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout)
    assert child < 200 * 2**20, child  # an interpreter with far.hardware: tens of MiB
    del ballast
