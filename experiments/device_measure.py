"""Measure far_train on MiniLM: whole-process peak RSS and step time, beside torch eager on the same batches.

    python experiments/device_measure.py --work /tmp/far_measure [--variants plain,xnnpack] [--batch 32]

The model is all-MiniLM-L6-v2 (the embedded package) reconfigured by FAR as `far demo` runs it: 20% learners
(random selection: no priming needed for a timing), embeddings and the bottom 2 layers frozen, so the export
has a forward-only bottom.pte (XNNPACK) and a train.pte over layers 2-5 and the head. Batch 32 x 64 tokens
(--batch changes the batch), every example full length. The script exports once per variant into WORK
(XNNPACK on the training program lowers for minutes), runs far_train under /usr/bin/time -v, then the same
steps in torch eager (the reconfigured model itself, far.SplitLinear, dropout off as in the program,
torch.optim.SGD) in a child process under /usr/bin/time -v too, and prints one JSON line per measurement.
Step times are medians over the steps after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import peak_rss_mib

RUNTIME = Path(__file__).resolve().parents[1] / "runtime" / "executorch"
LENGTH, LR, MOMENTUM = 64, 0.01, 0.9


def reconfigured_minilm():
    import far
    from far.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
    far.reconfigure(model, far.FARConfig(retention=0.2, selection="random", freeze_embeddings=True, freeze_layers=2))
    return model, tokenizer


def export(out: Path, xnnpack: bool, batch: int) -> dict:
    from far.device.export import export_executorch

    if (out / "manifest.json").is_file():
        return {"export_s": None, "reused": str(out)}
    model, tokenizer = reconfigured_minilm()
    start = time.perf_counter()
    result = export_executorch(
        model, tokenizer, out, batch_size=batch, max_length=LENGTH, lr=LR, momentum=MOMENTUM, xnnpack=xnnpack
    )
    return {
        "export_s": round(time.perf_counter() - start, 1),
        "sizes_MB": {k: round(v / 1e6, 1) for k, v in result.sizes.items()},
    }


def write_examples(path: Path, n: int, manifest: dict) -> None:
    """n full-length examples of random tokens, as far.device.write_examples lays them out."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, int(manifest["vocab_size"]), (n, LENGTH), generator=g)
    ids[:, 0] = 101
    tensors = {
        "input_ids": ids,
        "attention_mask": torch.ones(n, LENGTH, dtype=torch.long),
        "token_type_ids": torch.zeros(n, LENGTH, dtype=torch.long),
        "labels": torch.randint(0, 2, (n,), generator=g),
    }
    metadata = {
        "format": "far.device.examples",
        "format_version": "1",
        "max_length": str(LENGTH),
        "num_labels": "2",
        "base_fingerprint": manifest["base_fingerprint"],
        "truncated": "0",
    }
    save_file(tensors, path, metadata=metadata)


def run_runner(runner: Path, out: Path, examples: Path, threads: int, work: Path) -> dict:
    state = work / "state.safetensors"
    shutil.copy(out / "state.safetensors", state)
    cmd = [
        "/usr/bin/time",
        "-v",
        str(runner),
        str(out),
        "--examples",
        str(examples),
        "--state",
        str(state),
        "--epochs",
        "1",
        "--threads",
        str(threads),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    steps = [dict(w.split("=") for w in line.split()) for line in done.stdout.splitlines() if line.startswith("step=")]
    times = [float(s["time_s"]) for s in steps]
    return {
        "what": "far_train",
        "program": str(out),
        "threads": threads,
        "command": " ".join(cmd[2:]),
        "step_s": round(statistics.median(times[1:]), 3),
        "first_step_s": round(times[0], 3),
        "losses": [float(s["loss"]) for s in steps],
        "peak_rss_MiB": peak_rss_mib(done.stderr),
        "process_s": round(wall, 1),
        "plan": done.stdout.splitlines()[0],
    }


def eager_steps(examples: Path, threads: int, batch: int) -> None:
    """Child process: the same steps in torch eager; prints one JSON line."""
    import torch
    from safetensors.torch import load_file

    from far.device.order import batch_indices

    torch.set_num_threads(threads)
    model, _ = reconfigured_minilm()
    model.eval()  # no dropout, as in the exported program; gradients flow all the same
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    data = load_file(examples)
    n = data["labels"].shape[0]
    times, losses = [], []
    for step in range(n // batch):
        rows = torch.from_numpy(batch_indices(0, 0, step, n, batch))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(**{k: v[rows] for k, v in data.items()}).loss
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    print(
        json.dumps(
            {
                "step_s": round(statistics.median(times[1:]), 3),
                "first_step_s": round(times[0], 3),
                "losses": [round(x, 6) for x in losses],
            }
        )
    )


def run_eager(examples: Path, threads: int, batch: int) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--eager-child", str(examples), "--threads", str(threads)]
    cmd += ["--batch", str(batch)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"what": "torch eager", "threads": threads, **result, "peak_rss_MiB": peak_rss_mib(done.stderr)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/far_measure"))
    parser.add_argument("--variants", default="plain,xnnpack", help="plain, xnnpack or both (comma-separated)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32, help="the programs' batch size (64 tokens each)")
    parser.add_argument("--runner", type=Path, default=RUNTIME / "build" / "far_train")
    parser.add_argument("--eager-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eager_child:
        eager_steps(args.eager_child, args.threads, args.batch)
        return
    if not args.runner.is_file():
        raise SystemExit(f"no runner at {args.runner}: bash {RUNTIME / 'build.sh'}")
    args.work.mkdir(parents=True, exist_ok=True)
    examples = args.work / f"examples-b{args.batch}.safetensors"
    for variant in args.variants.split(","):
        out = args.work / f"minilm-{variant}" if args.batch == 32 else args.work / f"minilm-{variant}-b{args.batch}"
        info = export(out, xnnpack=variant == "xnnpack", batch=args.batch)
        print(json.dumps({"what": "export", "variant": variant, **info}), flush=True)
        manifest = json.loads((out / "manifest.json").read_text())
        if not examples.is_file():
            write_examples(examples, args.batch * args.steps, manifest)
        print(
            json.dumps(
                {
                    "variant": variant,
                    "load": os.getloadavg()[0],
                    **run_runner(args.runner, out, examples, args.threads, args.work),
                }
            ),
            flush=True,
        )
        print(
            json.dumps(
                {"variant": variant, "load": os.getloadavg()[0], **run_eager(examples, args.threads, args.batch)}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
