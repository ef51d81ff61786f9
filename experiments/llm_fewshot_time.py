"""Few-shot SST-2 with MeZO on the lean runtime: dev accuracy against seconds, one curve per arm and seed.

The question is the one a phone user has: which perturbed set reaches a given accuracy first on the
clock? A sparse set makes each step cheaper (less noise drawn) and, by the variance of an SPSA
estimate growing with the number of perturbed weights, each step better aimed; a primed selection
costs backward passes before the first step. So every curve's clock starts before the selection.

Arms (the embedding and tied LM head stay frozen in all of them, as on the lean runtime's CLI):

- `mezo`: plain MeZO, every other weight perturbed;
- `far`: FAR r=0.4 with gradient priming (the selection of `far glue --optimizer mezo --method far`
  without depth): the learner nodes and everything outside the FFNs;
- `magnitude`: FAR r=0.4 with the nodes of smallest weight magnitude as learners (Sparse-MeZO's rule
  over nodes; no priming, no data read);
- `lezo`: every weight but the embedding, a random quarter of the decoder layers perturbed each step
  (LeZO's layer-sparse perturbation);
- `magnitude_lezo`: both, the learner nodes of a random quarter of the layers each step.

Protocol (Malladi et al. 2023, after Gao et al. 2021): k examples per class of SST-2 train to train
on and another k per class, disjoint, to validate on, both sampled with the seed; the prompt
`<sentence> It was` with ` terrible` / ` great`; batch 16, eps 1e-3, a constant learning rate. The
learning rate of every arm is picked by the same rule: a grid run on seed 0 for `--grid-steps`,
the best validation accuracy (ties: lower validation loss); an arm whose pick is at the grid's edge
is reported so, to extend its grid. Dev accuracy is measured on the first `--dev-samples` dev
sentences every `--eval-every` steps, outside the clock.

Clock: `seconds` is the CPU time of the run's own training (selection, priming and steps; not
loading or evaluation). Every case runs in its own process with one torch thread, so this equals
its wall-clock time on an unshared core and does not move when other work shares the machine;
`wall_seconds` is recorded beside it.

Each case writes one JSON Lines file under `--output`/curves/ (renamed into place when the case
ends, so a file that exists is complete and is not run again), one object per evaluation with
model, k, arm, seed, lr, step, seconds, accuracy.

    python experiments/llm_fewshot_time.py --phase grid --k 16              # seed 0, each arm's lr grid
    python experiments/llm_fewshot_time.py --phase curves --k 16 --seeds 0  # the long runs at the picks
    python experiments/llm_fewshot_time.py --phase summary                  # -> summary.json / .md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import add_output_argument, case_result, machine, peak_rss_bytes, print_case, results_dir, start_case
from llm_fewshot import k_shot_split

import far
from far.data.locate import resolve_data_dir
from far.data.prompts import SST2_TEMPLATE, PromptBatches, label_word_ids, prompt_loss_fn, read_labelled_tsv
from far.llm.gguf_file import load_lean_model
from far.llm.lean_far import prime_and_split, set_trainable
from far.llm.prefix import PrefixCache
from far.llm.tokenizer import load_gguf_tokenizer
from far.llm.zo import CompactMeZO
from far.models import find_gguf
from far.recipes.causal_lm import PRIMING_MICRO_BATCH
from far.seeds import derive_seed


@dataclass(frozen=True)
class Arm:
    """What an arm perturbs: FFN nodes scored by `scoring` (None: no FAR split), kept as FAR keeps them
    (`retention` of all nodes, `selection`, the bottom `frozen_fraction` of the layers frozen whole), and
    the fraction of layers drawn each step (LeZO)."""

    scoring: str | None = None
    retention: float = 0.4
    selection: str = "per_layer"
    frozen_fraction: float | None = None
    layer_fraction: float = 1.0

    def freeze_layers(self, n_layers: int) -> int | None:
        return None if self.frozen_fraction is None else round(self.frozen_fraction * n_layers)


ARMS = {
    "mezo": Arm(),
    "far": Arm("gradient"),
    "magnitude": Arm("magnitude"),
    "lezo": Arm(layer_fraction=0.25),
    "magnitude_lezo": Arm("magnitude", layer_fraction=0.25),
    # FAR with depth: the learner budget over the top layers, the bottom frozen whole and computed once per prompt
    # (on SmolLM2's 30 layers: top10 keeps 10, with 30% of their FFN nodes; top10_full all of them).
    "far_top10": Arm("gradient", retention=0.1, frozen_fraction=2 / 3),
    "far_top10_full": Arm("gradient", retention=1 / 3, frozen_fraction=2 / 3),
    "far_top6": Arm("gradient", retention=0.1, frozen_fraction=0.8),
    "far_top15": Arm("gradient", retention=0.2, frozen_fraction=0.5),
}
RESULTS = results_dir(__file__)


def case_name(model: str, k: int, arm: str, seed: int, lr: float, steps: int, seconds: float | None = None) -> str:
    return f"{model}-k{k}-{arm}-seed{seed}-lr{lr:g}-" + (f"steps{steps}" if seconds is None else f"s{seconds:g}")


def prepare(
    model, arm: Arm, train: PromptBatches, order: list[int], args, label_ids
) -> tuple[CompactMeZO, object, PrefixCache | None]:
    """The arm's selection (priming on `args.priming_batches` batches in `order` where it scores by gradient),
    its optimizer, the training loss, and the cache of the frozen bottom's states where the arm freezes one
    (the training loss then runs on it)."""
    loss_fn = prompt_loss_fn(label_ids)
    if arm.scoring is None:
        set_trainable(model, "all")
    else:
        n = len(train)
        examples = [order[i % n] for i in range(args.priming_batches * args.batch)]
        micro = [train.batch(examples[i : i + PRIMING_MICRO_BATCH]) for i in range(0, len(examples), 4)]
        depth = arm.freeze_layers(len(model.layers))
        config = far.FARConfig(
            arm.retention, arm.selection, seed=args.seed, freeze_embeddings=True, freeze_layers=depth
        )
        prime_and_split(model, micro, loss_fn, config, scoring=arm.scoring)
    optimizer = CompactMeZO(model, args.lr, args.eps, seed=args.seed, layer_fraction=arm.layer_fraction)
    cache = PrefixCache(model) if model.lowest_trainable_layer() > 0 else None
    return optimizer, (cache.loss_fn(label_ids) if cache is not None else loss_fn), cache


def run_case(args: argparse.Namespace) -> dict:
    """Train one arm at one (k, seed, lr), evaluating every `eval_every` steps; writes its curve file."""
    torch.set_num_threads(args.threads)
    arm = ARMS[args.arm]
    gguf = find_gguf(args.model)
    tokenizer = load_gguf_tokenizer(gguf)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    glue = resolve_data_dir(args.data_dir) / "glue" / "SST-2"
    texts, labels = read_labelled_tsv(glue / "train.tsv")
    train_idx, val_idx = k_shot_split(labels, args.k, args.seed)
    pick = lambda idx: ([texts[i] for i in idx], [labels[i] for i in idx])  # noqa: E731
    train = PromptBatches(tokenizer, SST2_TEMPLATE, *pick(train_idx), args.max_length)
    validation = PromptBatches(tokenizer, SST2_TEMPLATE, *pick(val_idx[: 2 * args.max_validation_per_class]), 128)
    dev_texts, dev_labels = read_labelled_tsv(glue / "dev.tsv")
    dev = PromptBatches(tokenizer, SST2_TEMPLATE, dev_texts[: args.dev_samples], dev_labels[: args.dev_samples], 128)
    model = load_lean_model(gguf)
    n = len(train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(args.seed, 0))).tolist()

    def indices(step: int) -> list[int]:
        start = (step * args.batch) % n
        return [order[(start + j) % n] for j in range(min(args.batch, n))]

    clock = {"cpu": 0.0, "wall": 0.0}

    class timed:  # adds the block's CPU and wall time to the run's clock
        def __enter__(self):
            self.cpu, self.wall = time.process_time(), time.perf_counter()

        def __exit__(self, *exc):
            clock["cpu"] += time.process_time() - self.cpu
            clock["wall"] += time.perf_counter() - self.wall

    with timed():
        optimizer, train_loss, cache = prepare(model, arm, train, order, args, label_ids)
    # Evaluation runs outside the clock; where the arm freezes a bottom, its states come from the cache too
    # (the same values: a right-padded causal row does not depend on the rows beside it).
    label_logits = cache.label_logits if cache is not None else model.label_logits

    @torch.no_grad()
    def evaluate(data: PromptBatches) -> tuple[float, float]:
        """Accuracy and mean loss over `data`, in chunks of 32 prompts of similar length (as `predict` batches)."""
        order = sorted(range(len(data)), key=lambda i: len(data.texts[i]))
        logits = torch.empty(len(data), len(label_ids))
        for start in range(0, len(order), 32):
            chunk = order[start : start + 32]
            batch = data.batch(chunk)
            logits[chunk] = label_logits(batch["input_ids"], batch["attention_mask"], label_ids).float()
        labels = torch.tensor(data.labels)
        return float((logits.argmax(dim=-1) == labels).float().mean()), float(F.cross_entropy(logits, labels))

    base = dict(model=args.model, k=args.k, arm=args.arm, seed=args.seed, lr=args.lr, eps=args.eps)
    rows, losses = [], []
    args.curve.parent.mkdir(parents=True, exist_ok=True)
    partial = args.curve.with_suffix(".partial")
    with partial.open("w") as out:
        by_clock = args.seconds is not None and args.eval_seconds
        next_eval = args.eval_seconds if by_clock else 0.0
        for step in range(args.steps + 1):
            out_of_time = args.seconds is not None and clock["cpu"] >= args.seconds
            if by_clock:  # every arm gets its evaluations at the same seconds
                due = step == 0 or clock["cpu"] >= next_eval or out_of_time or step == args.steps
                while clock["cpu"] >= next_eval:
                    next_eval += args.eval_seconds
            else:
                due = step % args.eval_every == 0 or step == args.steps or out_of_time
            if due:
                validation_accuracy, validation_loss = evaluate(validation)
                row = {
                    **base,
                    "step": step,
                    "seconds": round(clock["cpu"], 3),
                    "wall_seconds": round(clock["wall"], 3),
                    "accuracy": evaluate(dev)[0],
                    "validation_accuracy": validation_accuracy,
                    "validation_loss": validation_loss,
                    "train_loss": statistics.fmean(losses[-10:]) if losses else None,
                    "dev_examples": len(dev),
                    "trainable_parameters": model.num_parameters(trainable_only=True),
                    "frozen_layers": model.lowest_trainable_layer(),
                }
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(
                    f"{args.curve.stem} step {step}: dev {row['accuracy']:.4f}, val {row['validation_accuracy']:.4f}"
                    f" / {row['validation_loss']:.4f}, {row['seconds']:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if step == args.steps or out_of_time:
                break
            batch = train.batch(indices(step))
            with timed():
                losses.append(optimizer.step(lambda b=batch: train_loss(model, b)))
    partial.replace(args.curve)
    return {**rows[-1], "curve": str(args.curve), "peak_rss_bytes": peak_rss_bytes()}


def load_curves(folder: Path) -> dict[str, list[dict]]:
    return {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(folder.glob("*.jsonl"))}


def pick_lr(curves: dict[str, list[dict]], model: str, k: int, arm: str, steps: int) -> tuple[float, bool] | None:
    """The grid's pick for an arm, and whether it lies at the grid's edge."""
    grid = {
        c[-1]["lr"]: c[-1]
        for name, c in curves.items()
        if name.startswith(f"{model}-k{k}-{arm}-seed0-") and name.endswith(f"-steps{steps}")
    }
    if not grid:
        return None
    best = min(grid.values(), key=lambda r: (-r["validation_accuracy"], r["validation_loss"]))["lr"]
    return best, len(grid) > 1 and best in (min(grid), max(grid))


def case_args(args, arm: str, seed: int, lr: float, steps: int, curve: Path, seconds: float | None = None) -> list[str]:
    clock = [] if seconds is None else ["--seconds", repr(seconds), "--eval-seconds", repr(args.eval_seconds)]
    return [
        *("--case", arm, "--seed", str(seed), "--lr", repr(lr), "--steps", str(steps), "--curve", str(curve)),
        *clock,
        *("--model", args.model, "--k", str(args.k), "--data-dir", str(args.data_dir)),
        *("--eval-every", str(args.eval_every if steps == args.steps else steps)),
        *("--dev-samples", str(args.dev_samples), "--threads", str(args.threads), "--eps", repr(args.eps)),
        *("--batch", str(args.batch), "--retention", str(args.retention)),
        *("--priming-batches", str(args.priming_batches)),
    ]


def diverged(curve: list[dict]) -> bool:
    """Whether a run ended with a higher validation loss than it started with."""
    return curve[-1]["validation_loss"] > curve[0]["validation_loss"]


def run_pending(args, todo: list[tuple[Path, list[str]]]) -> None:
    """Run the cases whose curve file does not exist yet, `args.jobs` side by side."""
    todo = [(curve, argv) for curve, argv in todo if not curve.exists()]
    running = []
    while todo or running:
        while todo and len(running) < args.jobs:
            curve, argv = todo.pop(0)
            running.append((curve, start_case(__file__, argv)))
        curve, proc = running.pop(0)
        result = case_result(proc)
        print(f"{curve.stem}: dev {result['accuracy']:.4f}, {result['seconds']:.0f} s", flush=True)


CURVE_KEYS = ("model", "k", "arm", "seed", "step", "seconds", "accuracy")


def mean_curve(runs: list[list[dict]]) -> list[dict]:
    """The seeds' curves averaged evaluation by evaluation (as far as the shortest goes): seconds and accuracy."""
    n = min(len(c) for c in runs)
    return [
        {
            "seconds": statistics.fmean(c[i]["seconds"] for c in runs),
            "step": statistics.fmean(c[i]["step"] for c in runs),
            "accuracy": statistics.fmean(c[i]["accuracy"] for c in runs),
        }
        for i in range(n)
    ]


def summarize(args) -> dict:
    """Per (model, k) and arm: the grid's lr, each seed's final dev accuracy, and the seconds the seed-mean curve
    takes to reach plain MeZO's final mean accuracy, against plain MeZO's whole run."""
    curves = load_curves(args.output.parent / "curves")
    rows = []
    for model, k in sorted({(c[0]["model"], c[0]["k"]) for c in curves.values()}):
        found = {}
        for arm in ARMS:
            picked = pick_lr(curves, model, k, arm, args.grid_steps)
            if picked is None:
                continue
            lr, at_edge = picked
            suffix = f"-lr{lr:g}-s{args.seconds:g}" if args.seconds is not None else f"-lr{lr:g}-steps{args.steps}"
            runs = [
                c for name, c in curves.items() if name.startswith(f"{model}-k{k}-{arm}-seed") and name.endswith(suffix)
            ]
            found[arm] = (lr, at_edge, runs)
        mezo_runs = found.get("mezo", (None, None, []))[2]
        target = statistics.fmean(c[-1]["accuracy"] for c in mezo_runs) if mezo_runs else None
        mezo_seconds = statistics.fmean(c[-1]["seconds"] for c in mezo_runs) if mezo_runs else None
        for arm, (lr, at_edge, runs) in found.items():
            grid = curves[case_name(model, k, arm, 0, lr, args.grid_steps)]
            row = {
                "model": model, "k": k, "arm": arm, "lr": lr, "lr_at_grid_edge": at_edge, "seeds": [],
                # the seed-0 grid run at the pick: where an arm that got no long run stood when it stopped
                "grid_accuracy": grid[-1]["accuracy"], "grid_seconds": grid[-1]["seconds"],
            }  # fmt: skip
            if runs:
                final = [c[-1]["accuracy"] for c in runs]
                curve = mean_curve(runs)
                reached = next((p for p in curve if target is not None and p["accuracy"] >= target), None)
                row.update(
                    seeds=sorted(c[0]["seed"] for c in runs),
                    final_accuracy=final,
                    final_mean=statistics.fmean(final),
                    final_std=statistics.stdev(final) if len(final) > 1 else 0.0,
                    seconds=statistics.fmean(c[-1]["seconds"] for c in runs),
                    steps=statistics.fmean(c[-1]["step"] for c in runs),
                    seconds_per_step=statistics.fmean(
                        (c[-1]["seconds"] - c[0]["seconds"]) / max(1, c[-1]["step"]) for c in runs
                    ),
                    selection_seconds=statistics.fmean(c[0]["seconds"] for c in runs),
                    trainable_parameters=runs[0][-1]["trainable_parameters"],
                    seconds_to_mezo_final=None if reached is None else reached["seconds"],
                    time_to_mezo_final_vs_mezo=None
                    if reached is None or not mezo_seconds
                    else reached["seconds"] / mezo_seconds,
                    mean_curve=curve,
                    curves=[[{key: e[key] for key in CURVE_KEYS} for e in c] for c in runs],
                )
            rows.append(row)
    return {
        "rows": rows,
        "seconds": args.seconds,
        "steps": args.steps,
        "grid_steps": args.grid_steps,
        "machine": machine(),
    }


def markdown(summary: dict) -> str:
    budget = (
        f"{summary['seconds']:g} training CPU-seconds per run" if summary["seconds"] else f"{summary['steps']} steps"
    )
    lines = [
        f"# SST-2 few-shot, MeZO arms on the clock (lean runtime, one thread per run, {budget})",
        "",
        "| model | k | arm | lr (seed-0 grid) | grid: dev accuracy, s | seeds | final dev accuracy | steps | s/step "
        "| selection s | time to plain MeZO's final / its run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        lr = f"{r['lr']:g}" + (" (grid edge)" if r["lr_at_grid_edge"] else "")
        grid = f"{100 * r['grid_accuracy']:.2f}, {r['grid_seconds']:.0f}"
        if not r["seeds"]:
            lines.append(f"| {r['model']} | {r['k']} | {r['arm']} | {lr} | {grid} | - | no long run | | | | |")
            continue
        ratio = r["time_to_mezo_final_vs_mezo"]
        lines.append(
            f"| {r['model']} | {r['k']} | {r['arm']} | {lr} | {grid} | {r['seeds']} | {100 * r['final_mean']:.2f} ± "
            f"{100 * r['final_std']:.2f} | {r['steps']:.0f} | {r['seconds_per_step']:.2f} | "
            f"{r['selection_seconds']:.1f} | {'not reached' if ratio is None else f'{ratio:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", nargs="+", choices=("grid", "curves", "summary"), default=["summary"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR"))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the curves phase")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3], help="every arm's seed-0 grid")
    parser.add_argument("--grid-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument(
        "--seconds", type=float, default=None, help="curves: train until the clock passes this (--steps caps the steps)"
    )
    parser.add_argument("--eval-seconds", type=float, default=100.0, help="curves with --seconds: evaluate this often")
    parser.add_argument("--dev-samples", type=int, default=256, help="first N dev sentences evaluated (of 872)")
    parser.add_argument("--max-validation-per-class", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--priming-batches", type=int, default=4, help="gradient-priming batches of --batch examples")
    parser.add_argument("--jobs", type=int, default=1, help="cases run side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per case")
    add_output_argument(parser, RESULTS / "summary.json", "the summary (.json, .md beside it; curves/ in its folder)")
    parser.add_argument("--case", choices=list(ARMS), help=argparse.SUPPRESS)  # internal: run one case
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--curve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        args.arm = args.case
        print_case(run_case(args))
        return 0

    curves_dir = args.output.parent / "curves"

    def case(arm: str, seed: int, lr: float, steps: int, seconds: float | None = None) -> tuple[Path, list[str]]:
        curve = curves_dir / f"{case_name(args.model, args.k, arm, seed, lr, steps, seconds)}.jsonl"
        return curve, case_args(args, arm, seed, lr, steps, curve, seconds)

    if "grid" in args.phase:
        # Rates in increasing order; a rate above one at which an arm diverged is not run for that arm.
        for lr in sorted(args.lrs):
            curves = load_curves(curves_dir)
            lower = {
                arm: [c for name, c in curves.items() if name.startswith(f"{args.model}-k{args.k}-{arm}-seed0-")]
                for arm in args.arms
            }
            arms = [
                arm
                for arm in args.arms
                if not any(c[0]["lr"] < lr and c[-1]["step"] == args.grid_steps and diverged(c) for c in lower[arm])
            ]
            run_pending(args, [case(arm, 0, lr, args.grid_steps) for arm in arms])
    if "curves" in args.phase:
        todo = []
        for arm in args.arms:
            picked = pick_lr(load_curves(curves_dir), args.model, args.k, arm, args.grid_steps)
            if picked is None:
                parser.error(f"no grid for {arm} at k={args.k}: run --phase grid first")
            todo += [case(arm, seed, picked[0], args.steps, args.seconds) for seed in args.seeds]
        run_pending(args, todo)
    if "summary" in args.phase:
        summary = summarize(args)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(summary, indent=1) + "\n")
        args.output.with_suffix(".md").write_text(markdown(summary))
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
