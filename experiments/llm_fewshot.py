"""Few-shot SST-2 on a small causal LM with the MeZO paper's protocol: zero-shot vs MeZO vs MeZO + FAR, over seeds.

Protocol (Malladi et al. 2023, after Gao et al. 2021): for each seed, k examples per class of SST-2
train to train on and another k per class, disjoint, to validate on, both sampled with the seed;
the prompt `<sentence> It was` with the label words ` terrible` / ` great`; the test set is SST-2
dev (all 872 sentences). MeZO: batch 16, eps 1e-3, one direction per step, the learning rate
decaying linearly to zero; `mezo` trains every weight (the paper's setting), `mezo_far` primes from
gradients on the training set (`far.training.prime_and_reconfigure`, r=0.4, embeddings frozen) and trains
the learners and the attention and norm weights; `mezo_far_emb` is `mezo_far` with the embedding (tied
to the LM head, so the label words' output rows too) trained as well.

The learning rate of each arm and k is picked on seed 0's validation set (never on dev) from a
grid; the paper's ({1e-7, 1e-6} for full-parameter OPT, 100k steps) does not carry over to a model
100x smaller run for a few hundred steps. What carries over is the size of a step: MeZO moves every
perturbed weight by lr·g·z_i, so an arm's grid is the learning rates whose step is `--relative-steps`
of its trainable weight matrices' rms, from g's rms at the pretrained weights as `llm_mezo_divergence.py`
measures it. Perturbing all 134.5M weights, embedding included, makes g 2.7x larger than FAR's
learners do, so the same lr is a 2.7x larger step on each weight: that is why plain MeZO diverged at
FAR's lr (3e-4) in `llm_sst2.py`. `--lrs` sets one grid for every arm instead. Seeds 1.. then rerun
each arm at its pick; seed 0's result is the grid run at the pick.

Every case runs in its own process (`--jobs` side by side, one torch thread each) and saves its
result under `--cases-dir` (default experiments/results/llm_fewshot/cases/); a case whose file exists
is not run again, so the grid can be run in pieces. The summary goes to `--output` (.json and .md beside
it; default experiments/results/llm_fewshot/llm_fewshot.json).

    python experiments/llm_mezo_divergence.py                         # g's rms and weights' rms of each arm
    python experiments/llm_fewshot.py --phase zero grid --k 16          # zero-shot, seed 0's grid
    python experiments/llm_fewshot.py --phase final --k 16 --seeds 1 2  # the other seeds at the picks
    python experiments/llm_fewshot.py --phase summary   # -> experiments/results/llm_fewshot/llm_fewshot.{json,md}
    # FAR with the embedding trained too; no probe measures its set, so its grid is given (plain's)
    python experiments/llm_fewshot.py --phase grid final summary --k 16 --arms mezo_far_emb --lrs 4e-05 1e-4 2e-4

Gemma-3-270M, after its own probe (`llm_mezo_divergence.py --model gemma3-270m --output ..._gemma3.json`):

    python experiments/llm_fewshot.py --model gemma3-270m --phase zero grid final summary --k 16 \
        --lrs-from experiments/results/llm_mezo_divergence/llm_mezo_divergence_gemma3.json \
        --cases-dir experiments/results/llm_fewshot/cases_gemma3 \
        --output experiments/results/llm_fewshot/llm_fewshot_gemma3.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from harness import (
    add_output_argument,
    case_result,
    machine,
    peak_rss_bytes,
    print_case,
    results_dir,
    start_case,
    write_report,
)

import far
from far.data.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    accuracy,
    encode_prompts,
    label_word_ids,
    prompt_loss_fn,
    read_labelled_tsv,
    sample_k_shot,
)
from far.models import load_causal_lm, resolve_model
from far.training import prime_and_reconfigure

ARMS = ("mezo", "mezo_far", "mezo_far_emb")
RESULTS = results_dir(__file__)


def k_shot_split(labels: list[int], k: int, seed: int) -> tuple[list[int], list[int]]:
    """Disjoint (train, validation) indices, k per class each, sampled with `seed`."""
    chosen = sample_k_shot(labels, 2 * k, seed=seed)  # 2k per class, classes interleaved
    seen: dict[int, int] = {}
    train, validation = [], []
    for i in chosen:
        label = labels[i]
        (train if seen.get(label, 0) < k else validation).append(i)
        seen[label] = seen.get(label, 0) + 1
    return train, validation


def length_bucketed(loss_fn, pieces: int):
    """`loss_fn` over a batch cut into `pieces` runs of similar length, each padded only to its own longest.

    The same mean loss (right padding never reaches a causal LM's answer position), with fewer
    padded tokens: SST-2's training phrases run from 2 to 50+ tokens, so a batch of 16 padded to
    its longest is mostly padding.
    """

    def bucketed(model, batch):
        lengths = batch["attention_mask"].sum(dim=1)
        order = lengths.argsort()
        total = 0.0
        for part in order.chunk(pieces):
            n = int(lengths[part].max())
            piece = {key: batch[key][part, :n] for key in ("input_ids", "attention_mask")}
            total = total + loss_fn(model, {**piece, "labels": batch["labels"][part]}) * len(part)
        return total / len(order)

    return bucketed


@torch.no_grad()
def mean_loss(model, examples, loss_fn, collate, batch_size: int = 32) -> float:
    total = 0.0
    for start in range(0, len(examples), batch_size):
        part = examples[start : start + batch_size]
        total += float(loss_fn(model, collate(part))) * len(part)
    return total / len(examples)


def run_case(args: argparse.Namespace) -> dict:
    """One case in this process: zero-shot, or one arm at one (k, seed, lr)."""
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = load_causal_lm(args.model)
    label_ids, pad = label_word_ids(tokenizer, SST2_TEMPLATE), tokenizer.pad_token_id
    collate, loss_fn = PromptCollator(pad), length_bucketed(prompt_loss_fn(label_ids), args.length_buckets)
    glue = Path(args.data_dir) / "glue" / "SST-2"
    sentences, labels = read_labelled_tsv(glue / "dev.tsv")
    n_dev = args.dev_samples or len(labels)
    dev = encode_prompts(tokenizer, sentences[:n_dev], labels[:n_dev], SST2_TEMPLATE)
    result: dict = {"case": args.case, "dev_examples": len(dev)}
    if args.case == "zero_shot":
        t = time.perf_counter()
        result["dev_accuracy"] = accuracy(model, dev, label_ids, pad)
        result["eval_seconds"] = time.perf_counter() - t
        result["peak_rss_bytes"] = peak_rss_bytes()
        return result

    sentences, labels = read_labelled_tsv(glue / "train.tsv")
    train_idx, val_idx = k_shot_split(labels, args.k, args.seed)
    encode = lambda idx: encode_prompts(  # noqa: E731
        tokenizer, [sentences[i] for i in idx], [labels[i] for i in idx], SST2_TEMPLATE
    )
    train, validation = encode(train_idx), encode(val_idx)[: 2 * args.max_validation_per_class]
    result.update(arm=args.arm, k=args.k, seed=args.seed, lr=args.lr, eps=args.eps, steps=args.steps)
    result.update(train_examples=len(train), validation_examples=len(validation))
    result["zero_shot_validation_accuracy"] = accuracy(model, validation, label_ids, pad)
    if args.arm in ("mezo_far", "mezo_far_emb"):
        t = time.perf_counter()
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + 1)).tolist()
        n_batches = min(args.priming_batches, len(train) // args.priming_batch)
        priming = [
            collate([train[i] for i in order[b * args.priming_batch : (b + 1) * args.priming_batch]])
            for b in range(n_batches)
        ]
        prime_and_reconfigure(
            model,
            priming,
            loss_fn,
            far.FARConfig(args.retention, seed=args.seed, freeze_embeddings=args.arm == "mezo_far"),
        )
        result["gradient_priming"] = {
            "batches": n_batches,
            "batch": args.priming_batch,
            "seconds": time.perf_counter() - t,
        }
    cpu = time.process_time()
    run = far.finetune(
        model,
        train,
        optimizer="mezo",
        retention=None,
        max_steps=args.steps,
        lr=args.lr,
        batch_size=args.batch,
        collate_fn=collate,
        loss_fn=loss_fn,
        mezo_eps=args.eps,
        seed=args.seed,
        progress=False,
        log_every=10**9,
    )
    result["train_cpu_seconds_per_step"] = (time.process_time() - cpu) / args.steps
    result["train_seconds_per_step"] = run.training_seconds / args.steps
    result["trainable_parameters"] = run.trainable_parameters
    result["final_train_loss"] = run.final_loss
    result["train_loss"] = mean_loss(model, train, loss_fn, collate)
    result["validation_loss"] = mean_loss(model, validation, loss_fn, collate)
    result["validation_accuracy"] = accuracy(model, validation, label_ids, pad)
    t = time.perf_counter()
    result["dev_accuracy"] = accuracy(model, dev, label_ids, pad)
    result["eval_seconds"] = time.perf_counter() - t
    result["seconds"] = time.perf_counter() - started
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result


def case_name(arm: str, k: int, seed: int, lr: float, steps: int) -> str:
    return f"{arm}-k{k}-seed{seed}-lr{lr:g}-steps{steps}"


def case_args(args, arm: str, k: int, seed: int, lr: float) -> list[str]:
    return [
        "--case",
        "train",
        "--arm",
        arm,
        "--k",
        str(k),
        "--seed",
        str(seed),
        "--lr",
        repr(lr),
        "--steps",
        str(args.steps),
        "--eps",
        repr(args.eps),
        "--batch",
        str(args.batch),
        "--model",
        args.model,
        "--data-dir",
        args.data_dir,
        "--threads",
        str(args.threads),
        "--length-buckets",
        str(args.length_buckets),
        "--max-validation-per-class",
        str(args.max_validation_per_class),
        *dev_args(args),
    ]


def dev_args(args) -> list[str]:
    return [] if args.dev_samples is None else ["--dev-samples", str(args.dev_samples)]


PROBE_OF_ARM = {"mezo": "all", "mezo_far": "far-0.4"}  # llm_mezo_divergence.py's names for the arms' sets


def scaled_grid(path: Path, arm: str, relative_steps: list[float]) -> list[float]:
    """The lrs whose MeZO step is each of `relative_steps` of the arm's matrices' rms, to one significant digit."""
    if not path.exists():
        raise SystemExit(f"{path} is missing: run experiments/llm_mezo_divergence.py first, or give --lrs")
    if arm not in PROBE_OF_ARM:
        raise SystemExit(f"llm_mezo_divergence.py measures no set for {arm}: give its grid with --lrs")
    probe = json.loads(path.read_text())["probes"][PROBE_OF_ARM[arm]]
    if "matrix_weight_rms" not in probe:
        raise SystemExit(
            f"{path} predates the step size scaled by the weight matrices: run experiments/llm_mezo_divergence.py again"
        )
    return [float(f"{r / 0.01 * probe['lr_for_1_percent_step']:.0e}") for r in relative_steps]


def load_cases(cases_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(cases_dir.glob("*.json"))}


def pick_lr(cases: dict[str, dict], arm: str, k: int, steps: int) -> float | None:
    """The grid's pick on seed 0's validation set: best accuracy, then lowest validation loss."""
    grid = [c for c in cases.values() if c.get("arm") == arm and c["k"] == k and c["seed"] == 0 and c["steps"] == steps]
    if not grid:
        return None
    return min(grid, key=lambda c: (-c["validation_accuracy"], c["validation_loss"]))["lr"]


def run_pending(args, todo: list[tuple[str, list[str]]]) -> None:
    """Run the cases not done yet, `args.jobs` at a time; each result is saved as soon as it ends."""
    args.cases_dir.mkdir(parents=True, exist_ok=True)
    todo = [(name, argv) for name, argv in todo if not (args.cases_dir / f"{name}.json").exists()]
    todo = todo[: args.max_cases] if args.max_cases is not None else todo
    running: list[tuple[str, object, float]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            name, argv = todo.pop(0)
            running.append((name, start_case(__file__, argv), time.perf_counter()))
        name, proc, started = running.pop(0)
        result = case_result(proc)
        result["wall_seconds"] = time.perf_counter() - started
        (args.cases_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(
            f"{name}: dev {result['dev_accuracy']:.4f}"
            + (
                f", validation {result['validation_accuracy']:.4f} (loss {result['validation_loss']:.4f})"
                if "validation_accuracy" in result
                else ""
            )
            + f", {result['wall_seconds']:.0f} s",
            flush=True,
        )


def summarize(args) -> dict:
    cases = load_cases(args.cases_dir)
    zero = cases.get("zero_shot", {}).get("dev_accuracy")
    rows = []
    for k in sorted({c["k"] for c in cases.values() if "k" in c}):
        for arm in ARMS:
            for steps in sorted({c["steps"] for c in cases.values() if c.get("arm") == arm and c["k"] == k}):
                lr = pick_lr(cases, arm, k, steps)
                if lr is None:
                    continue
                runs = sorted(
                    (
                        c
                        for c in cases.values()
                        if c.get("arm") == arm and c["k"] == k and c["steps"] == steps and c["lr"] == lr
                    ),
                    key=lambda c: c["seed"],
                )
                dev = [c["dev_accuracy"] for c in runs]
                grid = sorted(
                    (
                        c
                        for c in cases.values()
                        if c.get("arm") == arm and c["k"] == k and c["steps"] == steps and c["seed"] == 0
                    ),
                    key=lambda c: c["lr"],
                )
                rows.append(
                    {
                        "k": k,
                        "arm": arm,
                        "steps": steps,
                        "lr": lr,
                        "seeds": [c["seed"] for c in runs],
                        "dev_accuracy": dev,
                        "dev_mean": statistics.fmean(dev),
                        "dev_std": statistics.stdev(dev) if len(dev) > 1 else 0.0,
                        "above_zero_shot": None if zero is None else [d > zero for d in dev],
                        "trainable_parameters": runs[0]["trainable_parameters"],
                        "seconds_per_step": statistics.fmean(c["train_seconds_per_step"] for c in runs),
                        "grid": [
                            {
                                key: c[key]
                                for key in (
                                    "lr",
                                    "validation_accuracy",
                                    "validation_loss",
                                    "dev_accuracy",
                                    "train_loss",
                                )
                            }
                            for c in grid
                        ],
                    }
                )
    return {"model": args.model, "zero_shot_dev_accuracy": zero, "rows": rows, "cases": cases}


def markdown(summary: dict) -> str:
    zero = summary["zero_shot_dev_accuracy"]
    lines = [
        f"# {summary['model']}, SST-2 few-shot (MeZO protocol): dev accuracy",
        "",
        f"zero-shot: {zero:.4f}" if zero is not None else "zero-shot: not run",
        "",
        "| k | arm | steps | lr (picked on validation) | dev accuracy mean ± std | per seed | trainable | s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        per_seed = ", ".join(f"{d:.4f}" for d in r["dev_accuracy"])
        lines.append(
            f"| {r['k']} | {r['arm']} | {r['steps']} | {r['lr']:g} | {100 * r['dev_mean']:.2f} ± "
            f"{100 * r['dev_std']:.2f} | {per_seed} (seeds {r['seeds']}) | {r['trainable_parameters']:,} | "
            f"{r['seconds_per_step']:.2f} |"
        )
    lines += ["", "Grid (seed 0): lr -> validation accuracy / validation loss / dev accuracy / train loss", ""]
    for r in summary["rows"]:
        for g in r["grid"]:
            lines.append(
                f"- k={r['k']} {r['arm']} lr {g['lr']:g}: {g['validation_accuracy']:.4f} / "
                f"{g['validation_loss']:.4f} / {g['dev_accuracy']:.4f} / {g['train_loss']:.4f}"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", nargs="+", choices=("zero", "grid", "final", "summary"), default=["summary"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS[:2]))
    parser.add_argument("--k", type=int, default=16, help="examples per class (training; validation the same)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the final phase")
    parser.add_argument("--lrs", type=float, nargs="+", default=None, help="grid of seed 0, the same for every arm")
    parser.add_argument(
        "--lrs-from",
        type=Path,
        default=results_dir("llm_mezo_divergence") / "llm_mezo_divergence.json",
        help="without --lrs: each arm's grid comes from the g and weight rms measured there",
    )
    parser.add_argument(
        "--relative-steps",
        type=float,
        nargs="+",
        default=[0.01, 0.03, 0.06],
        help="without --lrs: each step moves a trainable weight by this fraction of the weight matrices' rms",
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--length-buckets", type=int, default=2, help="pieces of similar length per batch")
    parser.add_argument("--priming-batches", type=int, default=16)
    parser.add_argument("--priming-batch", type=int, default=4)
    parser.add_argument("--max-validation-per-class", type=int, default=128)
    parser.add_argument("--dev-samples", type=int, default=None, help="first N dev sentences (default: all 872)")
    parser.add_argument("--max-cases", type=int, default=None, help="run at most N pending cases (a piece)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per case")
    parser.add_argument("--cases-dir", type=Path, default=RESULTS / "cases", help="one JSON file per case")
    add_output_argument(parser, RESULTS / "llm_fewshot.json", "the summary (.json, and .md beside it)")
    parser.add_argument("--case", choices=("zero_shot", "train"), help=argparse.SUPPRESS)  # internal
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print_case(run_case(args))
        return 0

    resolve_model(args.model)  # build the model cache once, before cases start side by side
    todo: list[tuple[str, list[str]]] = []
    if "zero" in args.phase:
        todo.append(
            (
                "zero_shot",
                [
                    "--case",
                    "zero_shot",
                    "--model",
                    args.model,
                    "--data-dir",
                    args.data_dir,
                    "--threads",
                    str(args.threads),
                    *dev_args(args),
                ],
            )
        )
    if "grid" in args.phase:
        grids = {arm: args.lrs or scaled_grid(args.lrs_from, arm, args.relative_steps) for arm in args.arms}
        todo += [
            (case_name(arm, args.k, 0, lr, args.steps), case_args(args, arm, args.k, 0, lr))
            for i in range(max(map(len, grids.values())))
            for arm in args.arms
            for lr in grids[arm][i : i + 1]
        ]
    run_pending(args, todo)
    if "final" in args.phase:
        cases = load_cases(args.cases_dir)
        todo = []
        for arm in args.arms:
            lr = pick_lr(cases, arm, args.k, args.steps)
            if lr is None:
                parser.error(f"no grid results for {arm} at k={args.k}, {args.steps} steps: run --phase grid first")
            todo += [
                (case_name(arm, args.k, s, lr, args.steps), case_args(args, arm, args.k, s, lr)) for s in args.seeds
            ]
        run_pending(args, todo)
    if "summary" in args.phase:
        summary = summarize(args)
        summary["machine"] = machine()
        write_report(args.output, summary)
        args.output.with_suffix(".md").write_text(markdown(summary))
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
