"""MeZO step time, plain against FAR, on SmolLM2-135M with a few-shot SST-2 batch; and the restore's drift.

Configurations, all in this one process, one `far.MeZO` step each per round, in a rotated order:
    plain                  MeZO on every weight (134.5M, the MeZO paper's setting)
    plain+frozen-emb       every weight but the (tied) embedding
    far-0.4                FAR r=0.4, embeddings frozen (the CLI's LLM path): learners + attention + norms
    far-0.4+learners-only  FAR r=0.4, only the FFN learners trainable (sparse MeZO)
FAR's learners are chosen at random: the step time depends only on how many there are. The batch is
`--batch` prompts (`<sentence> It was`) of SST-2's k-shot training set, padded to the longest.

The split of a step: "forwards" is the time inside the closure (two no-grad forward passes), "noise"
the time inside `Tensor.normal_` (z, drawn again in every pass over the weights), the rest of the
step is MeZO's own arithmetic (perturb, restore, update, and any restore bookkeeping of the code measured).
The split comes from separate rounds with `normal_` timed, so that its wrapper does not touch the
step times of the ratio rounds. The FLOP-free bound: FAR does not shrink the forward passes, so its
step is at least (F + c·N_far) / (F + c·N_plain) of plain's, with F the forwards' time and c the
noise-and-arithmetic time per perturbed weight measured on plain.

Drift: `--drift-steps` flat-loss steps (g = 0: a step is only its perturb/restore round trip) on the
tensors of the first `--drift-layers` decoder layers; the rms and largest change of the weights,
against the rms of one update at `--lr` with the projected gradient g measured on the batch; and the
same round trip on a bf16 copy, for comparison.

Run it with `far` from a checkout of the code to measure (another version of far: PYTHONPATH=<its checkout>):

    python experiments/bench_mezo.py                          # -> experiments/results/bench_mezo/bench_mezo.json
    PYTHONPATH=/tmp/before python experiments/bench_mezo.py --label before --no-drift \\
        --output experiments/results/bench_mezo/bench_mezo_before.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from harness import add_output_argument, machine, results_dir, write_report

import far
from far.data.prompts import (
    SST2_TEMPLATE,
    PromptCollator,
    encode_prompts,
    label_word_ids,
    prompt_loss_fn,
    read_labelled_tsv,
    sample_k_shot,
)
from far.models import load_causal_lm

CONFIGS = ("plain", "plain+frozen-emb", "far-0.4", "far-0.4+learners-only")


class NormalTimer:
    """Times every `Tensor.normal_` call while active (MeZO draws z with it, and nothing else does here)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = torch.Tensor.normal_

    def __enter__(self) -> NormalTimer:
        original = self._original

        def timed(tensor, *args, **kwargs):
            t = time.perf_counter()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        torch.Tensor.normal_ = timed
        return self

    def __exit__(self, *exc) -> None:
        torch.Tensor.normal_ = self._original


def set_trainable(model: torch.nn.Module, config: str) -> None:
    """requires_grad as `config` says (MeZO reads the flags at every step)."""
    embedding = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if config == "plain":
            p.requires_grad_(True)
        elif config == "plain+frozen-emb":
            p.requires_grad_(p is not embedding)
        elif config == "far-0.4":
            p.requires_grad_(p is not embedding and not name.endswith("frozen_weight"))
        else:  # learners only
            p.requires_grad_(name.endswith("learner_weight"))


def n_trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def timed_step(optimizer: far.MeZO, loss_fn, model, batch) -> dict:
    forwards = [0.0]

    def closure():
        t = time.perf_counter()
        loss = loss_fn(model, batch)
        forwards[0] += time.perf_counter() - t
        return loss

    t = time.perf_counter()
    optimizer.step(closure)
    return {"step": time.perf_counter() - t, "forwards": forwards[0]}


def bench_steps(args, models: dict, batch, loss_fn) -> dict:
    optimizers = {
        c: far.MeZO([p for p in models[c].parameters()], lr=args.lr, eps=args.eps, seed=i)
        for i, c in enumerate(args.configs)
    }
    counts = {}
    for c in args.configs:
        set_trainable(models[c], c)
        counts[c] = n_trainable(models[c])
    timings: dict[str, list[dict]] = {c: [] for c in args.configs}
    split: dict[str, list[dict]] = {c: [] for c in args.configs}
    rounds = args.warmup + args.rounds + args.split_rounds
    for r in range(rounds):
        order = args.configs[r % len(args.configs) :] + args.configs[: r % len(args.configs)]
        seconds = {}
        for c in order:
            set_trainable(models[c], c)
            if r < args.warmup + args.rounds:
                t = timed_step(optimizers[c], loss_fn, models[c], batch)
                if r >= args.warmup:
                    timings[c].append(t)
            else:
                with NormalTimer() as noise:
                    t = timed_step(optimizers[c], loss_fn, models[c], batch)
                split[c].append({**t, "noise": noise.seconds})
            seconds[c] = t["step"]
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{c} {seconds[c]:.2f}s" for c in args.configs), flush=True)
    base = args.configs[0]
    result = {}
    for c in args.configs:
        steps = [t["step"] for t in timings[c]]
        paired = [t["step"] / b["step"] for t, b in zip(timings[c], timings[base], strict=True)]
        med = {k: statistics.median(s[k] for s in split[c]) for k in ("step", "forwards", "noise")}
        med["arithmetic"] = med["step"] - med["forwards"] - med["noise"]
        result[c] = {
            "trainable_parameters": counts[c],
            "step_seconds_median": statistics.median(steps),
            "step_seconds": steps,
            "ratio_to_plain": statistics.median(steps) / statistics.median(t["step"] for t in timings[base]),
            "paired_ratio_median": statistics.median(paired),
            "paired_ratio_quartiles": statistics.quantiles(paired, n=4)[::2] if len(paired) > 1 else paired,
            "split_medians": med,
        }
    # The bound FAR cannot pass: forwards are not shrunk; noise and arithmetic scale with the perturbed count.
    plain = result[base]["split_medians"]
    per_weight = (plain["noise"] + plain["arithmetic"]) / counts[base]
    for c in args.configs:
        forwards = plain["forwards"]
        result[c]["ratio_bound"] = (forwards + per_weight * counts[c]) / (forwards + per_weight * counts[base])
    return result


def drift(args, model, batch, loss_fn) -> dict:
    """Flat-loss steps on the first layers' weights: the restore's rounding walk, fp32 and bf16."""
    layers = model.model.layers[: args.drift_layers]
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for layer in layers for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    before = [p.detach().clone() for p in params]
    n = sum(p.numel() for p in params)
    optimizer = far.MeZO(params, lr=args.lr, eps=args.eps, seed=123)
    # The projected gradient at these weights on the batch, for the size of a real update.
    grads = []
    for _ in range(args.drift_g_samples):
        losses = []

        def closure(losses=losses):
            losses.append(float(loss_fn(model, batch)))
            return losses[-1]

        optimizer.step(closure)
        grads.append((losses[0] - losses[1]) / (2 * args.eps))
    with torch.no_grad():
        for p, b in zip(params, before, strict=True):
            p.copy_(b)
    rms_g = statistics.fmean(g * g for g in grads) ** 0.5
    for _ in range(args.drift_steps):
        optimizer.step(lambda: 0.0)
    diff = torch.cat([(p.detach() - b).view(-1) for p, b in zip(params, before, strict=True)])
    theta = torch.cat([b.view(-1) for b in before])
    # bf16: the same three in-place adds on a bf16 copy, z drawn as MeZO draws it
    half = [b.to(torch.bfloat16) for b in before]
    half_before = [h.clone() for h in half]
    for step in range(args.drift_steps):
        generator = torch.Generator().manual_seed(step)
        for h in half:
            z = torch.empty(h.shape).normal_(generator=generator).to(torch.bfloat16)
            h.add_(z, alpha=args.eps).add_(z, alpha=-2 * args.eps).add_(z, alpha=args.eps)
    half_diff = torch.cat([(h.float() - b.float()).view(-1) for h, b in zip(half, half_before, strict=True)])
    rms = lambda t: float(t.double().pow(2).mean().sqrt())  # noqa: E731
    update = args.lr * rms_g  # rms of one update lr·g·z per weight (E z² = 1)
    return {
        "tensors": f"decoder layers 0..{args.drift_layers - 1}",
        "elements": n,
        "steps": args.drift_steps,
        "eps": args.eps,
        "rms_weight": rms(theta),
        "fp32": {
            "rms_drift": rms(diff),
            "max_abs_drift": float(diff.abs().max()),
            "fraction_changed": float((diff != 0).float().mean()),
            "rms_drift_per_sqrt_step": rms(diff) / args.drift_steps**0.5,
        },
        "bf16": {
            "rms_drift": rms(half_diff),
            "rms_drift_in_eps_per_sqrt_step": rms(half_diff) / args.eps / args.drift_steps**0.5,
            "fraction_changed": float((half_diff != 0).float().mean()),
        },
        "projected_gradient_rms": rms_g,
        "projected_gradient_samples": grads,
        "lr": args.lr,
        "rms_update_one_step": update,
        "fp32_drift_of_all_steps_over_one_update": rms(diff) / update,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--split-rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--no-drift", dest="drift", action="store_false")
    parser.add_argument("--drift-steps", type=int, default=200)
    parser.add_argument("--drift-layers", type=int, default=1)
    parser.add_argument("--drift-g-samples", type=int, default=4)
    parser.add_argument("--label", default="after", help="which code this measures, for the report")
    add_output_argument(parser, results_dir(__file__) / "bench_mezo.json", "the JSON report")
    args = parser.parse_args(argv)
    if args.configs[0] != "plain":
        parser.error("the first configuration is the baseline of the ratios: start --configs with plain")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    models = {}
    plain, tokenizer = load_causal_lm(args.model)
    sentences, labels = read_labelled_tsv(Path(args.data_dir) / "glue" / "SST-2" / "train.tsv")
    chosen = sample_k_shot(labels, 16, seed=0)[: args.batch]
    examples = encode_prompts(tokenizer, [sentences[i] for i in chosen], [labels[i] for i in chosen], SST2_TEMPLATE)
    batch = PromptCollator(tokenizer.pad_token_id)(examples)
    loss_fn = prompt_loss_fn(label_word_ids(tokenizer, SST2_TEMPLATE))
    if any(c.startswith("plain") for c in args.configs):
        models.update({c: plain for c in args.configs if c.startswith("plain")})
    if any(c.startswith("far") for c in args.configs):
        far_model, _ = load_causal_lm(args.model)
        far.reconfigure(far_model, retention=0.4, selection="random", seed=0, freeze_embeddings=True)
        models.update({c: far_model for c in args.configs if c.startswith("far")})
    report = {
        "label": args.label,
        "far_file": far.__file__,
        "code_commit": subprocess.run(
            ["git", "-C", str(Path(far.__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "config": {k: v for k, v in vars(args).items() if k != "output"},
        "batch_shape": list(batch["input_ids"].shape),
        "machine": {**machine(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "steps": bench_steps(args, models, batch, loss_fn),
    }
    if args.drift:
        report["drift"] = drift(args, plain, batch, loss_fn)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    write_report(args.output, report)
    for c, r in report["steps"].items():
        s = r["split_medians"]
        print(
            f"{c:>22}: {r['trainable_parameters']:>11,} perturbed, step {r['step_seconds_median']:.2f}s "
            f"(x{r['ratio_to_plain']:.3f}, paired {r['paired_ratio_median']:.3f}, bound {r['ratio_bound']:.3f}); "
            f"forwards {s['forwards']:.2f}s, noise {s['noise']:.2f}s, arithmetic {s['arithmetic']:.2f}s"
        )
    if args.drift:
        d = report["drift"]
        print(
            f"drift after {d['steps']} flat steps: fp32 rms {d['fp32']['rms_drift']:.3g} (max "
            f"{d['fp32']['max_abs_drift']:.3g}) = {d['fp32_drift_of_all_steps_over_one_update']:.3g} of one update "
            f"at lr {d['lr']}; bf16 rms {d['bf16']['rms_drift']:.3g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
