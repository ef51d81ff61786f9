"""Why plain MeZO diverged on SmolLM2-135M (`llm_sst2.py`, lr 3e-4), and the learning rate that does not.

A MeZO step moves every perturbed weight by −lr·g·z_i, with g ≈ ∇L·z the loss's slope along the
direction z. g grows with what is perturbed: on k-shot SST-2 at the pretrained weights its rms is
51.6 with all 134.5M weights (the embedding, tied to the LM head, included) and 19.0 with FAR r=0.4's
58.4M (embeddings frozen). So one lr is a 2.7x larger step on each weight for plain MeZO: at 3e-4 that
is 8.5% of the weight matrices' rms per step, a random walk that in 12 steps moved the embedding by 1.5x and
the other weights by 1.1x their own norm (the loss, over 5 steps, rose from 1.0 to 4.2); FAR's 3.0% per step moved
its learners by 0.08x and the loss fell. At the lr whose step is 1% of the weights' rms (3.5e-5 for
all weights) plain MeZO descends too. Hence `llm_fewshot.py` scales each arm's grid by step size.

The step is measured against the weight matrices, not every weight: Gemma-3 stores its norm gains
at rms 14-171 (its matrices: 0.04), so a scale that counted them (1.38 over all weights) set a "1%"
lr of 1e-4 that moved the matrices by 37% per step, and both arms ended at chance. At 2.7e-6, 1% of
the matrices' rms, the same replay descends. Eight directions pin g's rms down only roughly: on
Gemma-3, FAR's estimate (212) came out above all weights' (142), which a subset cannot be in
expectation; hence `llm_fewshot.py`'s grid spans 1-6% steps rather than trusting one.

The script measures, on k-shot SST-2 training batches at the pretrained weights, g's rms and the
weight matrices' rms (their ratio gives the lr for a 1% step) and, for the record, the curvature along z
(q = zᵀHz ≈ (L(θ+εz) + L(θ−εz) − 2L(θ)) / ε², whose second-order stable bound 2·E[g²] / E[g²·q]
turned out useless here: q's estimates swing in sign from one direction to the next), for:
    all           every weight, embedding (tied to the LM head) included: llm_sst2's plain MeZO arm
    no-embedding  every weight but the embedding
    embedding     the embedding alone
    far-0.4       FAR r=0.4 after gradient priming, embeddings frozen: llm_sst2's MeZO + FAR arm
and then replays `--replay-steps` MeZO steps of llm_sst2's settings (lr 3e-4, eps 1e-3, batch 16) on
each of `all` and `far-0.4`, and as many at the lr for a `--relative-step` step, logging the loss and
how far the weights moved. It also records what was ruled out: the weights' dtype, dropout,
train/eval mode.

    python experiments/llm_mezo_divergence.py --directions 8 --replay-steps 12 --threads 1  # SmolLM2-135M
    python experiments/llm_mezo_divergence.py --model gemma3-270m --directions 8 --replay-steps 12 --threads 1 \
        --output experiments/results/llm_mezo_divergence/llm_mezo_divergence_gemma3.json
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from far.training import prime_and_reconfigure


@torch.no_grad()
def perturb(params: list[torch.Tensor], seed: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_(torch.empty_like(p).normal_(generator=generator), alpha=scale)


@torch.no_grad()
def probe(model, params, batches, loss_fn, directions: int, eps: float, seed: int) -> dict:
    """g and q along `directions` random directions over `params`, one batch each (cycling)."""
    snapshot = [p.detach().clone() for p in params]
    base = [float(loss_fn(model, b)) for b in batches]
    gs, qs = [], []
    for d in range(directions):
        b = d % len(batches)
        perturb(params, seed + d, eps)
        plus = float(loss_fn(model, batches[b]))
        perturb(params, seed + d, -2 * eps)
        minus = float(loss_fn(model, batches[b]))
        for p, s in zip(params, snapshot, strict=True):
            p.copy_(s)  # exact restore: every probe starts from θ
        gs.append((plus - minus) / (2 * eps))
        qs.append((plus + minus - 2 * base[b]) / eps**2)
    g2 = [g * g for g in gs]
    critical = 2 * statistics.fmean(g2) / statistics.fmean(g * q for g, q in zip(g2, qs, strict=True))
    g_rms = statistics.fmean(g2) ** 0.5
    w_rms = weight_rms(params)
    matrix_rms = weight_rms([p for p in params if p.ndim >= 2] or params)
    return {
        "perturbed": sum(p.numel() for p in params),
        "directions": directions,
        "loss_at_theta": statistics.fmean(base),
        "g_rms": g_rms,
        "weight_rms": w_rms,
        # a MeZO step moves every perturbed weight by lr·g·z_i: this lr makes that move 1% of the weight
        # matrices' rms. Norm gains are left out of the scale: Gemma-3 stores them at rms 14-171 against its
        # matrices' 0.04, and counting them set a "1%" lr that moved the matrices by 37% per step.
        "matrix_weight_rms": matrix_rms,
        "lr_for_1_percent_step": 0.01 * matrix_rms / g_rms,
        "q_mean": statistics.fmean(qs),
        "q_std": statistics.stdev(qs) if len(qs) > 1 else 0.0,
        "critical_lr": critical,
        "critical_lr_from_mean_q": 2 / statistics.fmean(qs),
        "g": gs,
        "q": qs,
    }


@torch.no_grad()
def weight_rms(params: list[torch.Tensor]) -> float:
    total = sum(float(p.detach().double().pow(2).sum()) for p in params)
    return (total / sum(p.numel() for p in params)) ** 0.5


def replay(model, batches, loss_fn, lr: float, eps: float, steps: int) -> dict:
    """`steps` MeZO steps (constant lr) over `batches`; the loss at θ per step and the weights' movement."""
    params = [p for p in model.parameters() if p.requires_grad]
    embedding = model.get_input_embeddings().weight
    start = {id(p): p.detach().clone() for p in params}
    optimizer = far.MeZO(params, lr=lr, eps=eps, seed=0)
    losses, seconds = [], time.perf_counter()
    for step in range(steps):
        batch = batches[step % len(batches)]
        losses.append(optimizer.step(lambda b=batch: loss_fn(model, b)))
    moved = {"embedding": 0.0, "other": 0.0}
    norms = {"embedding": 0.0, "other": 0.0}
    with torch.no_grad():
        for p in params:
            part = "embedding" if p is embedding else "other"
            moved[part] += float((p - start[id(p)]).double().pow(2).sum())
            norms[part] += float(start[id(p)].double().pow(2).sum())
            p.copy_(start[id(p)])
    return {
        "lr": lr,
        "eps": eps,
        "steps": steps,
        "losses": losses,
        "first_5_mean": statistics.fmean(losses[:5]),
        "last_5_mean": statistics.fmean(losses[-5:]),
        "weight_change_norm": {k: v**0.5 for k, v in moved.items()},
        # the move as a fraction of the weights' own norm: past ~1 the pretrained model is gone
        "weight_change_relative": {k: (moved[k] / norms[k]) ** 0.5 for k in moved if norms[k] > 0},
        "seconds": time.perf_counter() - seconds,
    }


def run_replays(replays: dict, name: str, probe_result: dict, model, batches, loss_fn, args) -> None:
    """Replay the set at `--lr` and at the lr whose step is `--relative-step` of its weights' rms."""
    matched = float(f"{probe_result['lr_for_1_percent_step'] * args.relative_step / 0.01:.1e}")
    for key, lr in ((name, args.lr), (f"{name}@{args.relative_step:g}-relative-step", matched)):
        replays[key] = replay(model, batches, loss_fn, lr, args.eps, args.replay_steps)
        r = replays[key]
        print(f"replay {key} (lr {lr:g}): loss {r['first_5_mean']:.3f} -> {r['last_5_mean']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--directions", type=int, default=12)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--lr", type=float, default=3e-4, help="the replay's learning rate (llm_sst2's)")
    parser.add_argument("--replay-steps", type=int, default=30)
    parser.add_argument(
        "--relative-step",
        type=float,
        default=0.01,
        help="each set is also replayed at the lr whose step moves its weights by this fraction of their rms",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_output_argument(parser, results_dir(__file__) / "llm_mezo_divergence.json", "the JSON report")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    model, tokenizer = load_causal_lm(args.model)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    sentences, labels = read_labelled_tsv(Path(args.data_dir) / "glue" / "SST-2" / "train.tsv")
    chosen = sample_k_shot(labels, args.k, seed=args.seed)
    train = encode_prompts(tokenizer, [sentences[i] for i in chosen], [labels[i] for i in chosen], SST2_TEMPLATE)
    collate, loss_fn = PromptCollator(tokenizer.pad_token_id), prompt_loss_fn(label_ids)
    batches = [collate(train[i * args.batch : (i + 1) * args.batch]) for i in range(args.batches)]
    embedding = model.get_input_embeddings().weight
    ruled_out = {
        "weight_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "model_training_mode": model.training,  # far.finetune keeps MeZO runs in eval mode too
        "attention_dropout": getattr(model.config, "attention_dropout", None),
        "dropout_modules_with_p": sorted({m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}),
        "embedding_tied_to_lm_head": model.get_output_embeddings().weight is embedding,
        "embedding_rms": float(embedding.detach().pow(2).mean().sqrt()),
        "other_weights_rms": float(
            torch.cat([p.detach().view(-1) for p in model.parameters() if p is not embedding]).pow(2).mean().sqrt()
        ),
    }
    sets = {
        "all": list(model.parameters()),
        "no-embedding": [p for p in model.parameters() if p is not embedding],
        "embedding": [embedding],
    }
    probes = {}
    for name, params in sets.items():
        probes[name] = probe(model, params, batches, loss_fn, args.directions, args.eps, seed=1000)
        print(
            f"{name}: {probes[name]['perturbed']:,} perturbed, q {probes[name]['q_mean']:.4g}, "
            f"critical lr {probes[name]['critical_lr']:.3g}",
            flush=True,
        )
    replays = {}
    run_replays(replays, "all", probes["all"], model, batches, loss_fn, args)

    train_order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + 1)).tolist()
    priming = [collate([train[i] for i in train_order[b * 4 : (b + 1) * 4]]) for b in range(16)]  # as llm_sst2
    prime_and_reconfigure(model, priming, loss_fn, far.FARConfig(0.4, seed=args.seed, freeze_embeddings=True))
    params = [p for p in model.parameters() if p.requires_grad]
    probes["far-0.4"] = probe(model, params, batches, loss_fn, args.directions, args.eps, seed=1000)
    print(
        f"far-0.4: {probes['far-0.4']['perturbed']:,} perturbed, q {probes['far-0.4']['q_mean']:.4g}, "
        f"critical lr {probes['far-0.4']['critical_lr']:.3g}",
        flush=True,
    )
    run_replays(replays, "far-0.4", probes["far-0.4"], model, batches, loss_fn, args)
    write_report(
        args.output,
        {
            "config": {k: v for k, v in vars(args).items() if k != "output"},
            "machine": {**machine(), "load_average_at_end": os.getloadavg()},
            "seconds": time.perf_counter() - started,
            "ruled_out": ruled_out,
            "probes": probes,
            "replays": replays,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
