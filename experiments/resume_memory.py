"""Peak memory of an own-texts run resumed after a kill, against the same run uninterrupted.

Three `far train` processes on the same texts (SmolLM2-135M, AdamW on FAR's learners, the bottom kept on disk, a
checkpoint every 2 steps, 4 steps), one thread each: the run to its end; the run killed (SIGKILL) once its step-2
checkpoint is written; and that run resumed (`--resume`) to its end. Each process's whole peak RSS is read from
`/usr/bin/time -v`. The target: the resumed process within the memory of the run it resumes.

    python experiments/resume_memory.py --texts docs
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import add_output_argument, command_line, machine, peak_rss_mib, results_dir, write_report

FAR = [sys.executable, "-m", "far.cli.main"]
ENV = {"OMP_NUM_THREADS": "1", "FAR_THREADS": "1"}


def timed(argv: list[str]) -> subprocess.Popen:
    command = ["/usr/bin/time", "-v", *FAR, *argv]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())


def _env() -> dict:
    return {**os.environ, **ENV}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", default="docs", help="a folder of .md/.txt files (default: docs)")
    parser.add_argument("--model", default="smollm2-135m")
    add_output_argument(parser, results_dir(__file__) / "resume_memory.json", "the report")
    args = parser.parse_args(argv)
    run = ["train", "--model", args.model, "--train-file", args.texts, "--max-steps", "4", "--checkpoint-every", "2"]
    run += ["--max-eval-samples", "8"]
    with tempfile.TemporaryDirectory() as work:
        whole, killed = Path(work) / "whole", Path(work) / "killed"
        done = timed([*run, "--output-dir", str(whole)])
        _, err = done.communicate()
        record = {"whole_peak_mib": peak_rss_mib(err)}
        victim = subprocess.Popen([*FAR, *run, "--output-dir", str(killed)], stderr=subprocess.DEVNULL, env=_env())
        while not (killed / "checkpoints" / "step-2").is_dir():
            if victim.poll() is not None:
                raise SystemExit("the run ended before its step-2 checkpoint: give more texts")
            time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        resumed = timed([*run, "--output-dir", str(killed), "--resume"])
        _, err = resumed.communicate()
        if resumed.returncode:
            raise SystemExit(f"the resumed run failed: {err[-2000:]}")
        record["resumed_peak_mib"] = peak_rss_mib(err)
    record["resumed_over_whole"] = record["resumed_peak_mib"] / record["whole_peak_mib"]
    print(record)
    write_report(args.output, {"command": command_line(__file__, argv), "machine": machine(), **record})


if __name__ == "__main__":
    main()
