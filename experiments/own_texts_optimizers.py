"""Which optimizer trains SmolLM2-135M on a user's texts best for the same CPU seconds, one thread.

Four arms on the corpus of `experiments/own_texts_corpus.py` (CPython's documentation topics), with the
held-out split `far train` makes (10% of the documents, seed 0):

- `mezo-plain`: MeZO on every weight, no FAR (two forward passes of the whole model a step);
- `mezo-far`: MeZO + FAR with depth (bottom two thirds frozen and cached, 10% learners above);
- `zo-batched-far`: the batched one-sided estimator (`far.llm.zo_batched`, 4 directions, 5 passes a step)
  + FAR with depth;
- `adamw-far`: AdamW on the FAR learners with depth (forward and backward of the top third).

Each arm runs in its own process (whole-process peak RSS is its own), one after the other. Its learning
rate is picked from a tiny grid by the loss on `--tune-chunks` chunks held out of the TRAINING chunks
(never the reported held-out set), each grid point trained for `--tune-cpu` CPU seconds. Then it trains
from the same start for `--cpu-budget` CPU seconds of steps, scoring held-out perplexity every
`--cpu-budget / --eval-points` CPU seconds of steps; evaluation's CPU seconds are measured apart and
left out of the budget. CPU seconds are the process's user + system time (`time.process_time`).

    OMP_NUM_THREADS=1 python experiments/own_texts_optimizers.py /tmp/python_docs.jsonl --cpu-budget 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from harness import lscpu_flags

from far.config import FARConfig
from far.data.texts import DEFAULT_HOLDOUT, load_text_chunks
from far.evaluation.perplexity import perplexity
from far.hardware import peak_rss_bytes
from far.llm.gguf_file import load_lean_model
from far.llm.lean_far import ZO_RETENTION, prime_and_split, set_trainable, zeroth_order_depth
from far.llm.prefix import PrefixCache
from far.llm.text_steps import MAX_PRIMING_CHUNKS, PRIMING_MICRO_BATCH, TextSteps, priming_loss
from far.llm.tokenizer import load_gguf_tokenizer
from far.models import find_gguf
from far.seeds import derive_seed

OUT = Path(__file__).parent / "results" / "own_texts_optimizers"
# arm -> (optimizer, FAR with depth, trained dtype, learning-rate grid). ZO arms keep `far train`'s bf16 storage.
ARMS = {
    "mezo-plain": ("mezo", False, torch.bfloat16, (1e-6, 1e-5)),
    "mezo-far": ("mezo", True, torch.bfloat16, (1e-5, 1e-4)),
    "zo-batched-far": ("zo-batched", True, torch.bfloat16, (1e-5, 1e-4)),
    "adamw-far": ("adamw", True, torch.float32, (1e-4, 3e-4)),
}
MAX_LENGTH, SEED = 256, 0


def train_for(steps: TextSteps, train: torch.Tensor, batch_size: int, budget: float, on_eval=None, every=None) -> dict:
    """Steps on batches of `train` (in a seeded order) until `budget` CPU seconds of steps; evaluation apart."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(derive_seed(SEED, 0))).tolist()
    step_cpu, eval_cpu, done, losses = 0.0, 0.0, 0, []
    next_eval = every
    while step_cpu < budget:
        start = (done * batch_size) % len(order)
        ids = train[order[start : start + batch_size]]
        t = time.process_time()
        losses.append(steps([ids]))
        step_cpu += time.process_time() - t
        done += 1
        if on_eval is not None and (step_cpu >= next_eval or step_cpu >= budget):
            t = time.process_time()
            on_eval(done, step_cpu)
            eval_cpu += time.process_time() - t
            next_eval += every
    return {"steps": done, "step_cpu_seconds": step_cpu, "eval_cpu_seconds": eval_cpu, "losses": losses}


def run_arm(arm: str, args: argparse.Namespace) -> dict:
    """One arm, in this process: learning rate from the grid on held-out training chunks, then the budgeted run."""
    optimizer, far, dtype, grid = ARMS[arm]
    torch.set_num_threads(1)
    cpu0 = time.process_time()
    gguf = find_gguf(args.model)
    tokenizer = load_gguf_tokenizer(gguf)
    chunks = load_text_chunks(args.texts, tokenizer, MAX_LENGTH, None, DEFAULT_HOLDOUT, SEED)
    validation = chunks.validation[: args.max_eval_chunks]
    # The tuning chunks come out of the training chunks: the reported held-out set never picks anything.
    shuffled = chunks.train[torch.randperm(len(chunks.train), generator=torch.Generator().manual_seed(SEED + 1))]
    tune, train = shuffled[: args.tune_chunks], shuffled[args.tune_chunks :]
    model = load_lean_model(gguf)
    if far:
        depth = zeroth_order_depth(model.config.num_layers)
        primed = train[:MAX_PRIMING_CHUNKS]
        batches = list(primed.split(PRIMING_MICRO_BATCH))
        prime_and_split(
            model, batches, priming_loss(depth), FARConfig(retention=ZO_RETENTION, freeze_layers=depth), dtype
        )
    else:
        set_trainable(model, "all", dtype, frozen_layers=0)
    depth = model.lowest_trainable_layer()
    start = [w.stored.clone() for w in model.trainable_weights()]
    setup_cpu = time.process_time() - cpu0
    eval_cache = PrefixCache(model, max_bytes=64 * 2**20) if depth else None
    tune_cache = PrefixCache(model, max_bytes=16 * 2**20) if depth else None

    def fresh_steps(lr: float) -> TextSteps:
        with torch.no_grad():  # every grid point and the run itself start from the same weights
            for weight, value in zip(model.trainable_weights(), start, strict=True):
                weight.stored.copy_(value)
        cache = PrefixCache(model, max_bytes=42 * 2**20) if depth else None  # `far train`'s share for training
        return TextSteps(model, optimizer, lr, cache, seed=SEED)

    grid_scores = []
    for lr in grid:
        result = train_for(fresh_steps(lr), train, args.batch_size, args.tune_cpu)
        score = perplexity(model, tune, args.eval_batch, tune_cache)
        grid_scores.append({"lr": lr, "tune_perplexity": score["perplexity"], "steps": result["steps"]})
        print(f"{arm} lr {lr:g}: tune perplexity {score['perplexity']:.3f} after {result['steps']} steps", flush=True)
    best = min(grid_scores, key=lambda r: r["tune_perplexity"])["lr"]

    curve = []

    def on_eval(step: int, cpu: float) -> None:
        scores = perplexity(model, validation, args.eval_batch, eval_cache)
        curve.append({"step": step, "cpu_seconds": cpu, **scores})
        print(f"{arm} step {step} at {cpu:.1f} CPU s: held-out perplexity {scores['perplexity']:.3f}", flush=True)

    steps = fresh_steps(best)
    on_eval(0, 0.0)
    every = args.cpu_budget / args.eval_points
    run = train_for(steps, train, args.batch_size, args.cpu_budget, on_eval, every)
    return {
        "arm": arm,
        "optimizer": optimizer,
        "far_with_depth": far,
        "frozen_layers": depth,
        "trained_dtype": str(dtype).removeprefix("torch."),
        "trainable_parameters": model.num_parameters(trainable_only=True),
        "lr_grid": grid_scores,
        "lr": best,
        "curve": curve,
        "perplexity_at_budget": curve[-1]["perplexity"],
        "perplexity_before": curve[0]["perplexity"],
        **{k: run[k] for k in ("steps", "step_cpu_seconds", "eval_cpu_seconds")},
        "setup_cpu_seconds": setup_cpu,
        "process_cpu_seconds": time.process_time() - cpu0,
        "peak_rss_bytes": peak_rss_bytes(),
        "train_chunks": len(train),
        "tune_chunks": len(tune),
        "validation_chunks": len(validation),
    }


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in records:
        ax.plot([p["cpu_seconds"] for p in r["curve"]], [p["perplexity"] for p in r["curve"]], "o-", label=r["arm"])
    ax.set_xlabel("CPU seconds of training steps (one thread; evaluation excluded)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("SmolLM2-135M on CPython's documentation topics")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("texts", help="the JSONL corpus written by experiments/own_texts_corpus.py")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--cpu-budget", type=float, default=300.0, help="CPU seconds of training steps per arm")
    parser.add_argument("--tune-cpu", type=float, default=30.0, help="CPU seconds of steps per learning rate tried")
    parser.add_argument("--tune-chunks", type=int, default=8)
    parser.add_argument("--eval-points", type=int, default=5)
    parser.add_argument("--max-eval-chunks", type=int, default=None, help="score the first N held-out chunks only")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--eval-batch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # one arm, in this process
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        record = run_arm(args.arm, args)
        record["settings"] = {k: v for k, v in vars(args).items() if k not in ("arm", "out")} | {
            "texts": str(args.texts)
        }
        (args.out / f"{args.arm}.json").write_text(json.dumps(record, indent=1) + "\n")
        return
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    for arm in args.arms:  # one after the other: each process alone holds its peak RSS and its thread
        subprocess.run([sys.executable, __file__, *forwarded, "--arm", arm], check=True, env={**os.environ})
    summarize(args.out)


def summarize(out: Path) -> dict:
    records = [json.loads((out / f"{arm}.json").read_text()) for arm in ARMS if (out / f"{arm}.json").exists()]
    summary = {
        "table": [
            {
                "arm": r["arm"],
                "lr": r["lr"],
                "perplexity_before": r["perplexity_before"],
                "perplexity_at_budget": r["perplexity_at_budget"],
                "steps": r["steps"],
                "step_cpu_seconds": r["step_cpu_seconds"],
                "eval_cpu_seconds": r["eval_cpu_seconds"],
                "peak_rss_mib": r["peak_rss_bytes"] / 2**20,
            }
            for r in records
        ],
        "lscpu_flags": lscpu_flags(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if records:
        plot(records, out / "perplexity_vs_cpu.png")
    return summary


if __name__ == "__main__":
    main()
