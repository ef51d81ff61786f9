"""A learners file per user for SmolLM2-135M: its size against the GGUF file's, the swap, `far generate`'s start-up.

Two users are trained with `far glue` (few-shot SST-2 prompts, the default MeZO + FAR with depth: the
bottom two thirds frozen, 10% of all FFN nodes as learners in the top third with those layers' attention
and norms, bf16), each run writing its learners file (`far.llm.lean_saving.save_trained`). Then, in this
process with one thread: the files' sizes and how their values are kept; swapping the two users on one
stock model (`far.load_learners`: the first visit of a file, then swaps between files the model verified
before, wall and CPU medians), with A -> B -> A checked bit for bit against A
loaded fresh; the time per generated token with the KV cache against running the whole text again; and,
in fresh processes, the wall time of `far generate --learners A --max-new-tokens 1` (interpreter start,
imports, model, tokenizer, the file and one token).

    OMP_NUM_THREADS=1 python experiments/lean_learners_file.py --steps 100 20  # -> experiments/results/<this script>/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from harness import (
    FAR,
    ROOT,
    add_output_argument,
    children_cpu_seconds,
    command_line,
    lscpu_flags,
    machine,
    results_dir,
    run_far_unless_done,
    write_report,
)

import far
from far.llm.lean_learners import read_file
from far.models import find_gguf, load_lean_lm

PROMPT = "My favourite film is"


def train_users(folder: Path, steps: list[int]) -> list[Path]:
    """A user per entry of `steps`, seeded by its position, trained for that many MeZO steps."""
    files = []
    for seed, n_steps in enumerate(steps):
        out = folder / f"user-{seed}"
        argv = ["glue", "--task", "sst2", "--model", "smollm2-135m", "--optimizer", "mezo", "--method", "far"]
        argv += ["--max-steps", str(n_steps), "--max-eval-samples", "16", "--seed", str(seed)]
        run_far_unless_done(argv, out)
        files.append(out / "trained.safetensors")
    return files


def describe(path: Path) -> dict:
    metadata, tensors = read_file(path)
    values = json.loads(metadata["values"])
    patched = sum(t.numel() for k, t in tensors.items() if k.endswith(".patch_index"))
    kept = sum(t.numel() for k, t in tensors.items() if k.endswith(".delta")) + sum(
        tensors[k].numel() for k in values if k in tensors
    )
    encodings = {e: sum(1 for v in values.values() if v["encoding"] == e) for e in ("delta8", "raw")}
    return {"bytes": path.stat().st_size, "values": kept, "patched_values": patched, "tensors_by_encoding": encodings}


def time_swaps(model, files: list[Path], swaps: int) -> dict:
    """The first file's load (it hashes the GGUF file too), the first swap to the second file (its contents
    hashed), then `swaps` swaps between files this model verified before: wall and CPU milliseconds."""

    def timed(path: Path) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        far.load_learners(model, path)
        return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3

    first_load, first_swap = timed(files[0]), timed(files[1])
    revisits = [timed(files[i % len(files)]) for i in range(swaps)]
    return {
        "first_load_ms": {"wall": first_load[0], "cpu": first_load[1]},
        "first_swap_ms": {"wall": first_swap[0], "cpu": first_swap[1]},
        "swaps": swaps,
        "median_swap_wall_ms": statistics.median(w for w, _ in revisits),
        "median_swap_cpu_ms": statistics.median(c for _, c in revisits),
    }


def a_b_a_is_bit_for_bit(name: str, files: list[Path]) -> bool:
    fresh, _ = load_lean_lm(name)
    far.load_learners(fresh, files[0])
    swapped, _ = load_lean_lm(name)
    for path in (files[0], files[1], files[0]):
        far.load_learners(swapped, path)
    ours, theirs = dict(swapped.named_parameters()), dict(fresh.named_parameters())
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@torch.no_grad()
def time_tokens(model, tokenizer, context: int, repeats: int) -> dict:
    """ms per new token at a `context`-token text: over the KV cache, and running the whole text again."""
    ids = (tokenizer(PROMPT)["input_ids"] * context)[:context]
    cached, again = [], []
    for _ in range(repeats + 1):  # the first round warms up
        cache = model.new_cache()
        model.next_token_logits(torch.tensor([ids[:-1]]), cache)
        t0 = time.perf_counter()
        model.next_token_logits(torch.tensor([ids[-1:]]), cache)
        t1 = time.perf_counter()
        model.next_token_logits(torch.tensor([ids]))
        cached.append(t1 - t0)
        again.append(time.perf_counter() - t1)
    return {
        "context_tokens": context,
        "cached_ms": statistics.median(cached[1:]) * 1e3,
        "whole_text_again_ms": statistics.median(again[1:]) * 1e3,
    }


def time_startup(file: Path, repeats: int) -> dict:
    """Wall and CPU seconds (user + system) of whole `far generate` processes writing one token."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    argv = [*FAR, "generate", "--model", "smollm2-135m", "--learners", str(file), "--prompt", PROMPT]
    wall, cpu = [], []
    for _ in range(repeats + 1):  # the first run warms the page cache
        t0, c0 = time.perf_counter(), children_cpu_seconds()
        done = subprocess.run([*argv, "--max-new-tokens", "1"], env=env, capture_output=True, text=True, check=True)
        wall.append(time.perf_counter() - t0)
        cpu.append(children_cpu_seconds() - c0)
    written = subprocess.run([*argv, "--max-new-tokens", "24"], env=env, capture_output=True, text=True, check=True)
    return {
        "median_wall_seconds": statistics.median(wall[1:]),
        "median_cpu_seconds": statistics.median(cpu[1:]),
        "wall_seconds": wall[1:],
        "cpu_seconds": cpu[1:],
        "stderr": done.stderr.strip(),
        "sample_output_24_tokens": written.stdout,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, nargs=2, default=[100, 20], help="MeZO steps of the two users' runs (far glue: 1000)"
    )
    parser.add_argument("--swaps", type=int, default=20)
    add_output_argument(parser, results_dir(__file__), "folder for report.json")
    parser.add_argument(
        "--runs",
        type=Path,
        default=ROOT / "runs" / "lean_learners_file",
        help="the users' runs (their files: tens of MB)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = train_users(args.runs, args.steps)
    gguf = find_gguf("smollm2-135m")
    model, tokenizer = load_lean_lm("smollm2-135m")
    sizes = {f.parent.name: describe(f) for f in files}
    runs = {f.parent.name: json.loads((f.parent / "metrics.json").read_text()) for f in files}
    report = {
        "command": command_line(__file__, argv),
        "machine": machine(),
        "lscpu_flags": lscpu_flags(),
        "torch_threads": torch.get_num_threads(),
        "gguf_bytes": gguf.stat().st_size,
        "files": sizes,
        "runs": {
            name: {k: r[k] for k in ("steps", "metrics", "trainable_parameters", "frozen_layers")}
            for name, r in runs.items()
        },
        "file_share_of_gguf": max(s["bytes"] for s in sizes.values()) / gguf.stat().st_size,
        "swap": time_swaps(model, files, args.swaps),
        "a_b_a_bit_for_bit": a_b_a_is_bit_for_bit("smollm2-135m", files),
        "tokens": [time_tokens(model, tokenizer, n, 5) for n in (16, 64)],
        "generate_startup": time_startup(files[0], 3),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "lscpu_flags"}, indent=2))
    write_report(args.output / "report.json", report)


if __name__ == "__main__":
    sys.exit(main())
