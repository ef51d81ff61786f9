"""The README's and docs/*.md's ```bash blocks run as written in a fresh clone, shrunk to a few steps.

Every line runs in order, in one folder laid out as a fresh clone (examples/, docs/ there, ../shared/data
beside it, no $FAR_DATA_DIR, the hub offline), so that a stale flag, a wrong path or a file that an
earlier command does not write fails here. `far` runs in this process (`far.cli.main.main`, what
the console script calls) with flags appended that shrink it (argparse: the last value wins);
the other commands (mkdir, cp, head, echo) run in bash. What is not run is listed in NOT_RUN, with why.
"""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from conftest import HAS_EXECUTORCH
from test_documented_commands import FAR_PROGRAMS, ROOT, documented_lines, option_strings, parse_error

from far.cli.main import main

pytestmark = pytest.mark.slow

# Commands in the documents that this test does not run (matched by how they start), and why.
NOT_RUN = {
    "bash .ci/setup": "builds .venv from PyPI: needs a network (CI ran it before the tests)",
    "python3 -m venv": "the install: needs a network for what follows, and .venv exists already",
    ". .venv/bin/activate": "the environment these tests run in",
    "pip install": "needs a network",
    ".venv/bin/python -m pytest": "the test suite itself",
    ".venv-device/bin/python -m pytest": "the test suite itself, its tests that need the device extra",
    # docs/device.md's walk-through of a causal LM on the C++ runner, whose SmolLM2 export is only parsed (below):
    "bash runtime/executorch/build.sh": "builds the C++ runner from the repository (tests/test_device_runner*.py do)",
    "cp runs/notes-device/state.safetensors": "copies from the SmolLM2 export, which is only parsed here",
    "runtime/executorch/build/far_train": "the runner on the SmolLM2 export (tests/test_device_runner_lm.py runs it on "
    "a tiny causal LM's export: its steps, perplexity and resume)",
    "cp OUT/state.safetensors": "copies from the SmolLM2 export with its generate program, which is only parsed here",
    "ids=$": "encodes the prompt with that export's tokenizer.json "
    "(tests/test_device_generate.py uses a tiny one's ids)",
    "runtime/executorch/build/far_generate": "greedy decoding on that export (tests/test_device_generate.py runs it on "
    "tiny Llama and Gemma-3 exports against far generate's tokens)",
}
# Without the device extra (.venv), `far export --executorch` refuses, after checking its flags and --checkpoint,
# with this; test_device_commands_run_as_written runs those commands in .venv-device.
WITHOUT_EXECUTORCH = "--executorch needs executorch"
# The document whose commands write what docs/device.md's export reads (runs/reviews-minilm-far), then that one.
DEVICE_DOCUMENTS = ("docs/your-data.md", "docs/device.md")
# `far` commands that are only parsed (every flag checked by the real parser), and why.
PARSE_ONLY = {
    "far glue --task sst2 --model gemma3-270m": "about a minute even shrunk (Gemma's 262k-token GGUF vocabulary); "
    "tests/test_llm_*.py run the lean runtime, SmolLM2's commands here run it end to end",
    "far export --model smollm2-135m": "about 4 CPU minutes and 1.8 GB even for a few steps (a whole SmolLM2-135M "
    "lowered to ExecuTorch programs); tests/test_device_lm.py exports tiny llama and gemma3 ones and holds them to "
    "the lean runtime",
    "far export --from-executorch runs/notes-device": "converts the runner's state of the SmolLM2 export, which is "
    "only parsed here (tests/test_device_runner_lm.py converts a tiny one's and generates with it)",
    "far generate --model smollm2-135m --learners notes-learners.safetensors": "reads the learners file that the "
    "runner's walk-through writes from the SmolLM2 export (tests/test_device_runner_lm.py generates with a tiny one)",
}
# `far` commands that fail today, with the message they fail with; each must still fail so (remove it once fixed).
KNOWN_FAILURES: dict[str, tuple[str, str]] = {}  # command -> (what it says, why), while a fix is pending
FEW = ["--max-steps", "2", "--max-train-samples", "16", "--max-eval-samples", "16", "--no-progress"]
# Flags that shrink each command to seconds.
SHRINK = {
    "glue": FEW,
    "squad": FEW,
    "train": FEW,
    "eval": ["--max-eval-samples", "16"],
    "demo": ["--max-train-samples", "64", "--max-eval-samples", "16", "--timing-rounds", "1"],
}
OPERATORS = {"&&", ";", "|", ">", ">>", "<"}


def shrunk(argv: list[str]) -> list[str]:
    """`argv` with the flags that make it run in seconds, and `--overwrite` where the folder may hold the same
    command's run from an earlier document."""
    extra = list(SHRINK.get(argv[0], []))
    if "--overwrite" in option_strings(argv[0]) and "--resume" not in argv:
        extra.append("--overwrite")
    return [*argv, *extra]


def listed(table: dict[str, object], words: list[str]) -> str | None:
    """The key of `table` that `words` (a command) starts with, if any."""
    text = " ".join(words)
    return next((key for key in table if text == key or text.startswith(key + " ")), None)


def bash(pipeline: list[list[str]], cwd) -> subprocess.CompletedProcess:
    """Run a pipeline of shell commands (words, operators among them) in bash."""
    words = [w for command in pipeline for w in (*command, "|")][:-1]
    script = " ".join(w if w in OPERATORS else shlex.quote(w) for w in words)
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def clone(tmp_path, data_dir, monkeypatch):
    """A fresh clone's folder, made current: examples/, docs/, README.md; ../shared/data beside it; no runs/."""
    root = tmp_path / "far"
    shutil.copytree(ROOT / "examples", root / "examples")
    shutil.copytree(ROOT / "docs", root / "docs")  # texts the own-texts commands train on
    shutil.copy(ROOT / "README.md", root / "README.md")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_dir, target_is_directory=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv("FAR_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return root


def run_far(argv: list[str], stdin: str, capsys, monkeypatch) -> tuple[int, str]:
    """`far argv` in this process, as the console script runs it: its exit code and the tail of what it said."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    printed = capsys.readouterr()
    return code, (printed.err.strip() or printed.out.strip())[-800:]


def run_lines(lines, clone, capsys, monkeypatch) -> tuple[list[str], dict[str, float], set[str]]:
    """Run documented `lines` in order in `clone`: what failed, each far command's seconds, the table keys used."""
    failures, seconds, used, ran = [], {}, set(), set()
    for line in lines:
        where = f"{line.document}: {line.text}"
        for pipeline in line.steps():
            *feeders, last = pipeline
            if key := listed(NOT_RUN, last):
                used.add(key)
            elif last[0] not in FAR_PROGRAMS:
                done = bash(pipeline, clone)
                if done.returncode != 0:
                    failures.append(f"{where}\n    exit {done.returncode}: {done.stderr.strip()[-500:]}")
            elif key := listed(PARSE_ONLY, ["far", *last[1:]]):
                used.add(key)
                if error := parse_error(last[1:]):
                    failures.append(f"{where}\n    {error}")
            elif tuple(argv := shrunk(last[1:])) not in ran:  # a command seen before would write the same files
                ran.add(tuple(argv))
                started = time.perf_counter()
                code, said = run_far(argv, bash(feeders, clone).stdout if feeders else "", capsys, monkeypatch)
                seconds[where] = time.perf_counter() - started
                if key := listed(KNOWN_FAILURES, ["far", *last[1:]]):
                    used.add(key)
                    if code == 0 or KNOWN_FAILURES[key][0] not in said:
                        failures.append(f"{where}\n    no longer fails: remove it from KNOWN_FAILURES ({said[-300:]})")
                elif "--executorch" in argv and not HAS_EXECUTORCH:
                    if code != 2 or WITHOUT_EXECUTORCH not in said:
                        failures.append(f"{where}\n    without executorch: exit {code}, not the refusal\n    {said}")
                elif code != 0:
                    failures.append(f"{where}\n    far {' '.join(argv)}: exit {code}\n    {said}")
    return failures, seconds, used


def assert_no_failures(failures: list[str], seconds: dict[str, float]) -> None:
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:5]
    assert not failures, "\n".join(failures) + "\nslowest: " + "; ".join(f"{t:.0f} s {w}" for w, t in slowest)


def test_documented_commands_run_as_written(clone, capsys, monkeypatch):
    failures, seconds, used = run_lines(documented_lines(), clone, capsys, monkeypatch)
    assert_no_failures(failures, seconds)
    stale = {*NOT_RUN, *PARSE_ONLY, *KNOWN_FAILURES} - used
    assert not stale, f"listed commands the documents no longer have: {stale}"
    assert len(seconds) >= 15, seconds


@pytest.mark.device
def test_device_commands_run_as_written(clone, capsys, monkeypatch):
    """docs/device.md's commands, with executorch, after the commands that write what they read."""
    lines = [line for document in DEVICE_DOCUMENTS for line in documented_lines() if line.document == document]
    failures, seconds, _ = run_lines(lines, clone, capsys, monkeypatch)
    assert_no_failures(failures, seconds)
    assert any("--executorch" in where for where in seconds), seconds
