"""Many users from one process: the resident memory of `far predict` and `far generate` from user to user.

`far predict --learners <folder>/*.safetensors --output-dir out` serves every user from one process: the base
loads once and each learners file is swapped in place (`far.recipes.users.predict_users`), so its memory
should stay at the base plus one file, whatever the number of users. This script makes N users' files
for a base (MiniLM, FAR r=0.39 at random with the embeddings and the bottom layer frozen, every trained
value perturbed from the user's seed: the files differ, no training), writes a rows file (SST-2 training
sentences), runs `far predict` on them as a child process under `/usr/bin/time -v` and samples its RSS
every 50 ms (psutil). A user counts as done when its output file appears (each is written whole, by a
rename); the report gives the RSS after user 1 and after every 10th, the growth from user 1 to the last,
the peak (`/usr/bin/time -v`), each user's swap time (the lines `far predict` prints) and the wall time.

`far generate --learners A B C ...` serves several users of a GGUF causal LM from one process the same way
(`far.load_learners` on one stock model); the same is measured for it on SmolLM2-135M (users made as
`far glue` would train them with depth: FAR r=0.1 at random, the bottom 20 of 30 layers frozen, the
trained values perturbed; a user is done when its `== <file> ==` text is printed).

    OMP_NUM_THREADS=1 python experiments/users_load.py --users 100 --rows 200 --generate-users 30
    # -> experiments/results/users_load/{predict,generate}.json
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from harness import FAR, add_output_argument, command_line, lscpu_flags, machine, results_dir, write_report

import far
from far.llm.gguf_file import load_lean_model
from far.llm.lean_far import prime_and_split
from far.llm.lean_saving import save_trained
from far.models import find_gguf, load_model_and_tokenizer

SAMPLE_SECONDS = 0.05
PROMPT = "My favourite film is"
SST2_TRAIN = Path(os.environ.get("FAR_DATA_DIR", "data")) / "glue" / "SST-2" / "train.tsv"


@torch.no_grad()
def perturb(parameters, seed: int, scale: float) -> None:
    """What a short fine-tune does to the trained values: small moves, from the user's seed."""
    generator = torch.Generator().manual_seed(seed)
    for p in parameters:
        p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * scale)


def make_encoder_users(folder: Path, n_users: int, model: str) -> list[Path]:
    """`n_users` learners files of `model` with a two-class head: FAR r=0.39, embeddings and 1 layer frozen."""
    base, _ = load_model_and_tokenizer(model, "classification", 2, label_names=["negative", "positive"])
    files = []
    for user in range(n_users):
        path = folder / f"user-{user:03d}.safetensors"
        if not path.exists():
            fine_tuned = copy.deepcopy(base)
            config = far.FARConfig(0.39, "random", seed=user, freeze_embeddings=True, freeze_layers=1)
            far.reconfigure(fine_tuned, config)
            perturb((p for p in fine_tuned.parameters() if p.requires_grad), 1000 + user, 1e-2)
            far.save_learners(fine_tuned, path)
        files.append(path)
    return files


def make_lm_users(folder: Path, n_users: int, model: str) -> list[Path]:
    """`n_users` learners files of a GGUF causal LM: FAR r=0.1 at random in the top third, bf16 values."""
    gguf = Path(model) if model.endswith(".gguf") else find_gguf(model)
    stock = load_lean_model(gguf)
    frozen = 2 * len(stock.layers) // 3
    files = []
    for user in range(n_users):
        path = folder / f"lm-user-{user:03d}.safetensors"
        if not path.exists():
            fine_tuned = copy.deepcopy(stock)
            config = far.FARConfig(0.1, "random", seed=user, freeze_layers=frozen)
            prime_and_split(fine_tuned, [], lambda m, b: None, config, torch.bfloat16)
            trained = [w.stored for w in fine_tuned.compact_weights() if w.trainable]
            perturb(trained, 1000 + user, 1e-2)
            save_trained(fine_tuned, path, base=gguf)
        files.append(path)
    return files


def write_rows(path: Path, n_rows: int) -> Path:
    """`n_rows` SST-2 training sentences as JSON Lines, {"text": ...} each."""
    with SST2_TRAIN.open(encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        sentences = [row["sentence"].strip() for _, row in zip(range(n_rows), reader, strict=False)]
    if len(sentences) < n_rows:
        raise ValueError(f"{SST2_TRAIN} has {len(sentences)} sentences, fewer than --rows {n_rows}")
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences), encoding="utf-8")
    return path


def run_sampled(argv: list[str], done: Callable[[list[str]], int]) -> dict:
    """Run `argv` under `/usr/bin/time -v`, sampling the command's RSS every 50 ms with how many users
    `done(stdout lines so far)` says are finished; returns the samples, outputs and the peak RSS."""
    timed = subprocess.Popen(
        ["/usr/bin/time", "-v", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
    readers = [
        threading.Thread(target=lambda name=name, s=stream: lines[name].extend(s), daemon=True)
        for name, stream in (("stdout", timed.stdout), ("stderr", timed.stderr))
    ]
    for reader in readers:
        reader.start()
    started, samples, target = time.perf_counter(), [], None
    while timed.poll() is None:
        try:
            if target is None:
                children = psutil.Process(timed.pid).children()
                target = children[0] if children else None
            if target is not None:
                rss, cpu = target.memory_info().rss, sum(target.cpu_times()[:2])
                samples.append((round(time.perf_counter() - started, 3), rss, done(lines["stdout"]), cpu))
        except psutil.NoSuchProcess:
            pass  # the command has just ended
        time.sleep(SAMPLE_SECONDS)
    for reader in readers:
        reader.join()
    report = "".join(lines["stderr"])
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    cpu = [float(m.group(1)) for m in re.finditer(r"(?:User|System) time \(seconds\): ([\d.]+)", report)]
    return {
        "cpu_seconds": round(sum(cpu), 1),
        "returncode": timed.returncode,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "samples": samples,
        "stdout": lines["stdout"],
        "stderr": lines["stderr"],
        "peak_rss_mib": round(int(peak.group(1)) / 1024, 1) if peak else None,
    }


def rss_by_user(samples: list[tuple[float, int, int, float]], n_users: int) -> dict[int, dict]:
    """RSS (MiB), wall and CPU seconds at the first sample after user 1, every 10th user and the last."""
    marks = sorted({1, *range(10, n_users + 1, 10), n_users})
    found = {}
    for mark in marks:
        sample = next((s for s in samples if s[2] >= mark), None)
        if sample is not None:
            seconds, rss, _, cpu = sample
            found[mark] = {"seconds": seconds, "cpu_seconds": round(cpu, 1), "rss_mib": round(rss / 2**20, 1)}
    return found


def growth(marks: dict[int, dict], start: int, end: int) -> dict | None:
    """RSS growth from the mark after user `start` to the one after user `end`, in MiB and percent."""
    if start not in marks or end not in marks or start >= end:
        return None
    mib = marks[end]["rss_mib"] - marks[start]["rss_mib"]
    percent = round(100 * mib / marks[start]["rss_mib"], 2)
    return {"from_user": start, "to_user": end, "mib": round(mib, 1), "percent": percent}


def per_user_cpu(samples: list[tuple[float, int, int, float]]) -> float | None:
    """The command's CPU seconds per user after the first (start-up and the first load left out)."""
    done = [s for s in samples if s[2] >= 1]
    if not done or done[-1][2] == done[0][2]:
        return None
    return round((done[-1][3] - done[0][3]) / (done[-1][2] - done[0][2]), 2)


def rss_while_serving(samples: list[tuple[float, int, int, float]], n_users: int) -> list[float]:
    """The highest RSS (MiB) sampled while each user was served: user k from user k-1's end to its own."""
    highest = [0.0] * n_users
    for _, rss, done, _ in samples:
        if done < n_users:
            highest[done] = max(highest[done], round(rss / 2**20, 1))
    return highest


def summary(run: dict, n_users: int) -> dict:
    """The RSS marks, the growth from user 1 (and from user 10, past the first users' one-off work) to the
    last user, the run's peak RSS and its wall and CPU time."""
    marks = rss_by_user(run["samples"], n_users)
    serving = rss_while_serving(run["samples"], n_users)
    return {
        "rss_after_user": marks,
        # The first user's includes the base's loading; from the second on, each is a swap and its predictions.
        "rss_max_while_serving_user_mib": serving,
        "rss_max_while_serving_users_2_to_11_mib": max(serving[1:11], default=None),
        "rss_max_while_serving_last_10_users_mib": max(serving[-10:], default=None),
        "rss_growth": growth(marks, 1, n_users),
        "rss_growth_after_warm_up": growth(marks, 10, n_users),
        "rss_max_after_user_1_mib": round(max((s[1] for s in run["samples"] if s[2] >= 1), default=0) / 2**20, 1),
        "peak_rss_mib": run["peak_rss_mib"],
        "wall_seconds": run["wall_seconds"],
        "cpu_seconds": run["cpu_seconds"],
        "returncode": run["returncode"],
    }


def shown_command(head: list[str], users: Path, options: list[str], folder: Path) -> str:
    """The command as a shell would be given it: the users' files as a glob, the scratch folder as <folder>."""
    shown = ["far", *head, "--learners", f"{users}/*.safetensors", *options]
    return " ".join(f"'{a}'" if " " in a else a for a in shown).replace(str(folder), "<folder>")


def measure_predict(folder: Path, args: argparse.Namespace) -> dict:
    (folder / "users").mkdir(exist_ok=True)
    files = make_encoder_users(folder / "users", args.users, args.model)
    rows = write_rows(folder / "rows.jsonl", args.rows)
    out = folder / "out"
    shutil.rmtree(out, ignore_errors=True)
    options = ["--input", str(rows), "--output-dir", str(out)]
    argv = [*FAR, "predict", "--model", args.model, "--learners", *map(str, files), *options]

    def users_done(stdout: list[str]) -> int:
        return len(list(out.glob("*.jsonl"))) if out.is_dir() else 0

    run = run_sampled(argv, users_done)
    return {
        "command": shown_command(["predict", "--model", args.model], folder / "users", options, folder),
        "users": args.users,
        "rows_per_user": args.rows,
        **per_user(run, files, args.users, "swap_ms_median", r"\(swapped in (\d+) ms\)"),
    }


def measure_generate(folder: Path, args: argparse.Namespace) -> dict:
    (folder / "lm-users").mkdir(exist_ok=True)
    files = make_lm_users(folder / "lm-users", args.generate_users, args.lm)
    options = ["--prompt", PROMPT, "--max-new-tokens", str(args.max_new_tokens)]
    argv = [*FAR, "generate", "--model", args.lm, "--learners", *map(str, files), *options]

    def users_done(stdout: list[str]) -> int:
        return sum(line.startswith("== ") for line in stdout)

    run = run_sampled(argv, users_done)
    return {
        "command": shown_command(["generate", "--model", args.lm], folder / "lm-users", options, folder),
        "users": args.generate_users,
        "max_new_tokens": args.max_new_tokens,
        **per_user(run, files, args.generate_users, "apply_ms_median", r"applied in (\d+) ms"),
    }


def per_user(run: dict, files: list[Path], users: int, key: str, pattern: str) -> dict:
    """What a sampled run of `users` learners files cost each: the files' mean size, the median of the milliseconds
    its stderr lines report by `pattern` (as `key`), seconds and CPU seconds, and the run's memory summary."""
    timed = [float(m.group(1)) for line in run["stderr"] if (m := re.search(pattern, line))]
    file_mib = [f.stat().st_size / 2**20 for f in files]
    return {
        "learners_file_mib": round(sum(file_mib) / len(file_mib), 2),
        key: sorted(timed)[len(timed) // 2] if timed else None,
        "seconds_per_user": round(run["wall_seconds"] / users, 2),
        "cpu_seconds_per_user": per_user_cpu(run["samples"]),
        **summary(run, users),
        "tail": run["stderr"][-30:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100, help="users of far predict (default: 100)")
    parser.add_argument("--rows", type=int, default=1000, help="rows each user's model predicts (default: 1000)")
    parser.add_argument("--model", default="minilm", help="the encoder base (default: minilm)")
    parser.add_argument("--generate-users", type=int, default=20, help="users of far generate; 0 skips it")
    parser.add_argument("--lm", default="smollm2-135m", help="the GGUF causal LM (default: smollm2-135m)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens each user writes (default: 8)")
    parser.add_argument("--skip-predict", action="store_true", help="measure far generate only")
    parser.add_argument("--keep", type=Path, default=None, help="make (and reuse) the users' files in this folder")
    add_output_argument(parser, results_dir(__file__), "the folder of the JSON reports")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    header = {"script": command_line(__file__, None), "machine": machine(), "lscpu_flags": lscpu_flags()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if not args.skip_predict:
            report = measure_predict(folder, args)
            write_report(args.output / "predict.json", {**header, **report})
            print(json.dumps({k: v for k, v in report.items() if k != "tail"}, indent=1))
        if args.generate_users:
            report = measure_generate(folder, args)
            write_report(args.output / "generate.json", {**header, **report})
            print(json.dumps({k: v for k, v in report.items() if k != "tail"}, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
