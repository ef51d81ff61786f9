"""How well aimed is one MeZO step of each arm? Projected gradients measured over many directions, at the start.

MeZO's step moves the perturbed weights S along z by `-lr * p`, with `p = (L(w + eps z) - L(w - eps z)) / 2 eps`
~= z . g_S (g_S: the loss gradient restricted to S). For z ~ N(0, I_S), E[p^2] = |g_S|^2: averaging p^2
over directions measures the gradient energy the arm can see, without a backward pass. The expected
loss decrease of a step at the best learning rate is about |g_S|^2 / (d_S + 2) (the SPSA estimate's
variance grows with the d_S perturbed weights), so `density = E[p^2] / (d_S + 2)` ranks arms by how much
one step can do, and `density / seconds per step` by how much a second of the clock can do.

Every arm is set up as `llm_fewshot_time.py` sets it up (priming included), on the same k-shot batch
(seed 0), and measured with `--directions` directions drawn as its steps draw them (LeZO: a new
layer subset each). Writes `--output` (.json, .md beside it).

    python experiments/llm_zo_variance.py --arms mezo far magnitude lezo far_top10 --directions 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from harness import add_output_argument, machine, results_dir
from llm_fewshot import k_shot_split
from llm_fewshot_time import ARMS, prepare

from far.data.locate import resolve_data_dir
from far.data.prompts import SST2_TEMPLATE, PromptBatches, label_word_ids, read_labelled_tsv
from far.llm.gguf_file import load_lean_model
from far.llm.tokenizer import load_gguf_tokenizer
from far.models import find_gguf
from far.seeds import derive_seed

RESULTS = results_dir(__file__)


@torch.no_grad()
def measure(arm_name: str, args: argparse.Namespace) -> dict:
    """One arm: E[p^2], the spread of p, d_S and the seconds of a step, on seed 0's first training batch."""
    gguf = find_gguf(args.model)
    tokenizer = load_gguf_tokenizer(gguf)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    texts, labels = read_labelled_tsv(resolve_data_dir(args.data_dir) / "glue" / "SST-2" / "train.tsv")
    train_idx, _ = k_shot_split(labels, args.k, 0)
    train = PromptBatches(
        tokenizer, SST2_TEMPLATE, [texts[i] for i in train_idx], [labels[i] for i in train_idx], args.max_length
    )
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(derive_seed(0, 0))).tolist()
    model = load_lean_model(gguf)
    args.seed, args.lr = 0, 1e-4
    with torch.enable_grad():
        optimizer, loss, _ = prepare(model, ARMS[arm_name], train, order, args, label_ids)
    batch = train.batch(order[: args.batch])
    perturbation = model.perturbation
    projected, seconds = [], []
    for i in range(args.directions):
        seed, active = derive_seed(7, i), optimizer.active_weights(i)
        start = time.process_time()
        perturbation.set(seed, args.eps, active)
        plus = float(loss(model, batch))
        perturbation.set(seed, -args.eps, active)
        minus = float(loss(model, batch))
        perturbation.clear()
        seconds.append(time.process_time() - start)
        projected.append((plus - minus) / (2 * args.eps))
    trainable = model.num_parameters(trainable_only=True)
    perturbed = trainable * (ARMS[arm_name].layer_fraction if ARMS[arm_name].layer_fraction < 1 else 1.0)
    energy = statistics.fmean(p * p for p in projected)
    return {
        "arm": arm_name,
        "trainable_parameters": trainable,
        "perturbed_per_step": round(perturbed),
        "mean_p2": energy,
        "std_p": statistics.stdev(projected),
        "density": energy / (perturbed + 2),
        "seconds_per_two_passes": statistics.median(seconds[1:] or seconds),
    }


def markdown(report: dict) -> str:
    rows = report["arms"]
    mezo = next((r for r in rows if r["arm"] == "mezo"), rows[0])
    lines = [
        f"# MeZO step quality per arm ({report['model']}, k={report['k']}, {report['directions']} directions)",
        "",
        "E[p^2] estimates |g_S|^2; density = E[p^2] / (d_S + 2) is the loss one step can remove at the best rate,",
        "up to a constant; per second divides it by the two forward passes' CPU time.",
        "",
        "| arm | perturbed / step | E[p^2] | std p | density / mezo | s per 2 passes | per second / mezo |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_s = (r["density"] / r["seconds_per_two_passes"]) / (mezo["density"] / mezo["seconds_per_two_passes"])
        lines.append(
            f"| {r['arm']} | {r['perturbed_per_step']:,} | {r['mean_p2']:.4g} | {r['std_p']:.4g} | "
            f"{r['density'] / mezo['density']:.2f} | {r['seconds_per_two_passes']:.2f} | {per_s:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR"))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["mezo", "far", "magnitude", "lezo"])
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--directions", type=int, default=64)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--priming-batches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    add_output_argument(parser, RESULTS / "llm_zo_variance.json", "the report (.json, .md beside it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {
        "model": args.model,
        "k": args.k,
        "directions": args.directions,
        "eps": args.eps,
        "command": "python experiments/llm_zo_variance.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "arms": [measure(arm, args) for arm in args.arms],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
