"""The C++ runner's readers under AddressSanitizer and UndefinedBehaviorSanitizer, and its state writer on a full disk.

`runtime/executorch/tests/fuzz_readers.cpp` feeds mutated inputs to far_train's readers (JSON, safetensors, the
training state, manifest.json, the examples file, a causal LM's chunks file, SHA-256): each must be accepted or
refused with far's error and a message, with no crash, no sanitizer report and no allocation sized by a number in
the file. It is built here with `-DFAR_SANITIZE=ON` (every finding fatal) and no ExecuTorch, into a temporary
folder, and run with 10,000 inputs per reader; CTest runs a few hundred without sanitizers in every build of the runner.

The state writer (`far::write_state`, what far_train checkpoints with) is run on a 64 KiB tmpfs: a state that
does not fit stops with a message naming the disk and the bytes, exit status 1, and the previous state stays
byte for byte with no partial file beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RUNNER_DIR = Path(__file__).resolve().parents[1] / "runtime" / "executorch"
INPUTS_PER_READER = 10_000
READERS = ("json", "safetensors", "state", "manifest", "examples", "chunks", "sha256")
FUZZ_SEED = 52


def _compiler() -> str | None:
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def _missing_tool(tmp: Path) -> str | None:
    if shutil.which("cmake") is None:
        return "cmake is not installed (needed to build runtime/executorch's fuzz driver)"
    compiler = _compiler()
    if compiler is None:
        return "no C++ compiler (c++, g++ or clang++) to build runtime/executorch's fuzz driver"
    probe = tmp / "probe.cpp"
    probe.write_text("int main() { return 0; }\n")
    done = subprocess.run(
        [compiler, "-fsanitize=address,undefined", str(probe), "-o", str(tmp / "probe")], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"{compiler} cannot build with -fsanitize=address,undefined (libasan/libubsan?): {done.stderr[-300:]}"
    return None


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> Path:
    """far_core, the fuzz driver and the C++ tests, built with ASan and UBSan (no ExecuTorch) once per module."""
    build = tmp_path_factory.mktemp("far_core_sanitized")
    reason = _missing_tool(build)
    if reason:
        pytest.skip(reason)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = subprocess.run(
        ["cmake", "-S", str(RUNNER_DIR), "-B", str(build), *generator, "-DFAR_TRAIN=OFF", "-DFAR_SANITIZE=ON",
         "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stdout + configure.stderr
    jobs = os.environ.get("FAR_TRAIN_JOBS", "2")
    built = subprocess.run(["cmake", "--build", str(build), "-j", jobs], capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return build


def test_readers_survive_mutated_inputs_under_sanitizers(sanitized, tmp_path):
    """10,000 mutated inputs per reader, then the regression inputs (findings kept as files): 0 crashes, 0 findings."""
    crash = tmp_path / "crash.bin"
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    done = subprocess.run(
        [str(sanitized / "fuzz_readers"), "--seed", str(FUZZ_SEED), "--count", str(INPUTS_PER_READER),
         "--regressions", str(RUNNER_DIR / "tests" / "data" / "fuzz"), "--crash-file", str(crash),
         "--save", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    report = done.stdout + done.stderr[-6000:]
    assert done.returncode == 0, f"{report}\n(the input being read when it stopped: {crash}, kept: {crash.exists()})"
    assert "AddressSanitizer" not in done.stderr and "runtime error" not in done.stderr, report
    assert "findings=0" in done.stdout, report
    for reader in READERS:
        line = re.search(rf"^{reader}\s+inputs=(\d+) .* findings=0 ", done.stdout, re.M)
        assert line and int(line.group(1)) >= INPUTS_PER_READER, report


def test_cpp_tests_pass_under_sanitizers(sanitized):
    """The C++ tests (order, state, optimizer, formats, disk and CTest's short fuzz run), sanitized."""
    done = subprocess.run(
        ["ctest", "--test-dir", str(sanitized), "--output-on-failure"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100% tests passed" in done.stdout, done.stdout


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs mounted for the test (skipped where mounting is not allowed), unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mount_cmd = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]
    done = subprocess.run(mount_cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_state_writer_on_a_full_disk(sanitized, small_disk):
    """A state too big for the disk: exit 1, a message naming the disk and the bytes, the previous state intact."""
    writer, state = sanitized / "test_disk", small_disk / "state.safetensors"
    first = subprocess.run([str(writer), "--write", str(state), "1000"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = state.read_bytes()

    done = subprocess.run([str(writer), "--write", str(state), "40000"], capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr
    assert f"no space left on the disk mounted at {small_disk} (tmpfs filesystem 'tmpfs')" in message, message
    needed = re.search(r"it needs (\d+) bytes, (\d+) bytes are free", message)
    assert needed, message
    assert 40000 * 4 < int(needed.group(1)) < 40000 * 4 + 1024 and int(needed.group(2)) < 64 * 1024, message
    assert f"{state} keeps its previous version, unchanged" in message, message
    assert state.read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["state.safetensors"]

    # With the disk filled by another file, a small state does not fit either; nothing changes.
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(free - 2048, 0))
    done = subprocess.run([str(writer), "--write", str(state), "1000"], capture_output=True, text=True)
    assert done.returncode == 1 and "no space left on the disk mounted at" in done.stderr, done.stderr
    assert state.read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "state.safetensors"]
    filler.unlink()
    again = subprocess.run([str(writer), "--write", str(state), "1200"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
