"""Step benchmark: time and memory of one training step, FAR against full fine-tuning.

All configurations of one (model, shape, precision) cell are built once and timed interleaved, round after round
(each round in a rotated order), in this one process, so machine noise hits them alike; each reports the median of
its timed steps after warm-up, its ratio to full's median, and the median and quartiles of its per-round ratios to
full's step of the same round. Beside each measured ratio to full fine-tuning stand two bounds: the FLOP-bound ratio
(matrix products only, see far.analysis.flops; with backward's depth, and without it, as if backward always ran to the
bottom) and the roofline ratio (far.analysis.roofline: FLOPs and bytes at rates calibrated in this process, one
calibration round after each round of steps, experiments/calibrate.py). `--clock cpu` times in CPU seconds, for a
machine that other jobs share.
After the timing, each configuration's step is measured once more for memory (experiments/step_memory.py): bytes
autograd keeps for backward, and the peak of live tensors (what is resident at the step's start, plus the most the
step allocates on top). MeZO steps (far.MeZO, one direction) and no-grad forward passes are timed the same way, FAR
r=0.4 against the plain model. Whole-process peak RSS comes from separate processes (one per configuration,
`--memory`), since it cannot be attributed within one.

The optimizer is `torch.optim.AdamW` as a plain training loop builds it (`--optimizer adamw`), or its fused kernel.
The CPU's flags are recorded with the numbers: bf16 products are native only with AVX-512 BF16 or AMX.
`--output` is the reports' path without suffix (.json and .md are written), default
experiments/results/bench_step/bench_step.

    python experiments/bench_step.py                     # MiniLM, 32x64 and 32x128, fp32 and bf16
    python experiments/bench_step.py --models minilm distilbert --steps 10 --memory
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from calibrate import Calibration, load_model, word_embedding
from harness import add_output_argument, command_line, cpu, machine, results_dir, write_report
from step_memory import peak_live_bytes, saved_for_backward_bytes

import far
from far.analysis.flops import step_flops
from far.analysis.roofline import step_seconds
from far.hardware import native_bf16
from far.layers import SplitLinear
from far.methods.lora import LoraSettings, add_lora

CONFIGS: dict[str, Callable[[torch.nn.Module], torch.nn.Module]] = {}


def _scores(groups: dict) -> dict[str, torch.Tensor]:
    # Timing does not depend on which nodes learn, only on how many: seeded random scores.
    generator = torch.Generator().manual_seed(0)
    return {name: torch.rand(g.n_nodes, generator=generator) for name, g in groups.items()}


def _far(retention: float, **kwargs) -> Callable[[torch.nn.Module], torch.nn.Module]:
    # A name says whether activations are recomputed ("+recompute"), whatever FARConfig's default is, so that
    # committed results keep their meaning: without the suffix, the learners' activation is kept.
    kwargs.setdefault("recompute_activations", False)

    def apply(m: torch.nn.Module) -> torch.nn.Module:
        heads = _scores(far.find_attention(m)) if kwargs.get("attention_retention") is not None else None
        return far.reconfigure(m, retention, scores=_scores(far.find_ffns(m)), head_scores=heads, **kwargs)

    return apply


CONFIGS.update(
    {
        "full": lambda m: m,
        "far-0.2": _far(0.2),
        "far-0.4": _far(0.4),
        "far-0.6": _far(0.6),
        "random-0.4": lambda m: far.reconfigure(m, 0.4, selection="random", recompute_activations=False),
        "random-0.4+recompute": lambda m: far.reconfigure(m, 0.4, selection="random", recompute_activations=True),
        "freeze-ffn": far.freeze_ffns,
        "far-0.4+frozen-emb": _far(0.4, freeze_embeddings=True),
        # Plain freezing by depth, the baselines for FAR's freeze_layers: backward stops at layer K.
        "full+frozen-emb": lambda m: far.freeze_layers(m, 0),
        "full+frozen-emb+bottom-3": lambda m: far.freeze_layers(m, 3),
        "far-0.2+frozen-emb+bottom-3": _far(0.2, freeze_embeddings=True, freeze_layers=3),
        # FAR's automatic cut in `far demo` (SST-2) with r=0.2 and the depth rule's first constant: the bottom 2
        # layers frozen, 20% of all nodes learners above.
        "far-0.2+frozen-emb+bottom-2": _far(0.2, freeze_embeddings=True, freeze_layers=2),
        # ... and with retention and depth both from priming (demo.txt): 1 layer frozen, 39% of all nodes learners.
        "far-0.39+frozen-emb+bottom-1": _far(0.39, freeze_embeddings=True, freeze_layers=1),
        "far-0.4+recompute": _far(0.4, recompute_activations=True),
        # Attention heads split too, at three head retentions (1.0: every head a learner, the split's own cost).
        "far-0.4+heads-1.0": _far(0.4, attention_retention=1.0),
        "far-0.4+heads-0.4": _far(0.4, attention_retention=0.4),
        "far-0.4+heads-0.2": _far(0.4, attention_retention=0.2),
        "far-0.4+heads-0.4+recompute": _far(0.4, attention_retention=0.4, recompute_activations=True),
        "far-0.2+heads-0.2+frozen-emb": _far(0.2, attention_retention=0.2, freeze_embeddings=True),
        # Hugging Face PEFT's LoRA with its defaults (r=8, alpha 8, BERT: query and value), the head trained.
        "lora": lambda m: add_lora(m, LoraSettings()),
    }
)
# Configurations that are not in the default grid (they need an optional dependency: PEFT).
OPTIONAL_CONFIGS = ("lora",)


FROZEN_EMB = "+frozen-emb"


def build_config(name: str, model: torch.nn.Module) -> torch.nn.Module:
    """Apply a named configuration; `far-<R>` is FAR at any retention R (for sweeps), `far-<R>+frozen-emb` the same
    with the embeddings frozen too."""
    if name in CONFIGS:
        return CONFIGS[name](model)
    try:
        retention = float(name.removeprefix("far-").removesuffix(FROZEN_EMB)) if name.startswith("far-") else None
    except ValueError:
        retention = None
    if retention is not None:
        return _far(retention, freeze_embeddings=name.endswith(FROZEN_EMB))(model)
    raise ValueError(
        f"unknown configuration {name!r}: one of {', '.join(CONFIGS)}, far-<retention> or far-<retention>{FROZEN_EMB}"
    )


OPTIMIZERS = ("adamw", "adamw-fused")
# `cpu`: the process's CPU seconds (both threads), which other jobs on the cores barely move; `wall`: elapsed time.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def make_optimizer(model: torch.nn.Module, kind: str = "adamw") -> torch.optim.Optimizer:
    """`adamw`: torch.optim.AdamW's defaults, as a plain loop or the Trainer builds it; `adamw-fused`: one kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-5, fused=kind == "adamw-fused")


def make_batch(model: torch.nn.Module, batch: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, model.config.vocab_size, (batch, length), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": torch.randint(0, 2, (batch,), generator=generator),
    }


def train_step(model, optimizer, batch, bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_cell(
    base: torch.nn.Module,
    configs: list[str],
    batch: int,
    length: int,
    bf16: bool,
    steps: int,
    warmup: int,
    optimizer: str = "adamw",
    memory: bool = True,
    clock: str = "wall",
) -> dict:
    """Time `configs` interleaved; returns {"configs": per-configuration rows, "rates": the roofline's rates}."""
    prepared = {}
    for name in configs:
        model = build_config(name, copy.deepcopy(base)).train()
        prepared[name] = (model, make_optimizer(model, optimizer))
    data = make_batch(base, batch, length)
    times: dict[str, list[float]] = {name: [] for name in configs}
    names = list(prepared)
    now = CLOCKS[clock]
    calibration = Calibration(base, batch, length, bf16, now)
    for round_ in range(warmup + steps):
        # Each round starts one configuration later, so that no configuration always runs first or last in a round.
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            model, optimizer = prepared[name]
            start = now()
            train_step(model, optimizer, data, bf16)
            if round_ >= warmup:
                times[name].append(now() - start)
        if round_ >= warmup:
            calibration.round()  # the rates are sampled on the machine as the steps found it
    rates = calibration.rates()
    full_model = prepared["full"][0]
    full_flops = step_flops(full_model, batch, length).total
    full_flops_no_depth = step_flops(full_model, batch, length, depth=False).total
    full_seconds, _ = step_seconds(full_model, batch, length, rates, bf16=bf16)
    rows = summarize_times(times)
    for name, (model, optimizer_) in prepared.items():
        rows[name]["flop_bound_ratio"] = step_flops(model, batch, length).total / full_flops
        rows[name]["flop_bound_ratio_no_depth"] = (
            step_flops(model, batch, length, depth=False).total / full_flops_no_depth
        )
        seconds, terms = step_seconds(model, batch, length, rates, bf16=bf16)
        rows[name]["roofline_step_s"] = seconds
        rows[name]["roofline_terms_s"] = terms
        rows[name]["roofline_ratio"] = seconds / full_seconds
        rows[name]["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows[name]["step_times_s"] = times[name]  # round by round, for ratios of any two configurations
        if memory:
            rows[name].update(step_memory(model, optimizer_, data, bf16))
    for name in rows:
        for key in ("saved_for_backward_bytes", "peak_live_bytes") if memory else ():
            rows[name][key.replace("_bytes", "_ratio")] = rows[name][key] / rows["full"][key]
    embedding_elements = word_embedding(full_model).weight.numel()
    return {"configs": rows, "rates": asdict(rates), "embedding_elements": embedding_elements}


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Tensor memory that lives across steps: weights, buffers, optimizer state, FAR's cast caches."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    tensors += [value for m in model.modules() if isinstance(m, SplitLinear) for _, value in m._cache.values()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def step_memory(model, optimizer, data, bf16: bool) -> dict:
    """Bytes kept for backward, and peak live tensors of one whole step (forward, backward, optimizer)."""

    def loss() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            return model(**data).loss

    saved = saved_for_backward_bytes(model, loss)
    optimizer.zero_grad(set_to_none=True)
    resident = resident_bytes(model, optimizer)
    peak = peak_live_bytes(lambda: train_step(model, optimizer, data, bf16))
    return {"saved_for_backward_bytes": saved, "resident_bytes": resident, "peak_live_bytes": resident + peak}


def summarize_times(times: dict[str, list[float]]) -> dict[str, dict]:
    """Per configuration: the median step, its ratio to full's median, and the spread of the paired ratios.

    `times[name][i]` is the step of round i. A paired ratio divides a configuration's step by full's
    step of the same round (a few seconds apart), so slow drift of the machine cancels; its quartiles
    say how far one round's ratio can be trusted, which a ratio of medians alone hides.
    """
    full = times["full"]
    full_median = statistics.median(full)
    rows = {}
    for name, steps in times.items():
        median = statistics.median(steps)
        paired = [step / full_step for step, full_step in zip(steps, full, strict=True)]
        q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
        rows[name] = {
            "median_step_s": median,
            "ratio_to_full": median / full_median,
            "paired_ratio_median": statistics.median(paired),
            "paired_ratio_q1": q1,
            "paired_ratio_q3": q3,
            "steps": len(steps),
        }
    return rows


def time_mezo(
    base: torch.nn.Module, batch: int, length: int, bf16: bool, steps: int, warmup: int, lora: bool = False
) -> dict:
    """far.MeZO steps (two forward passes, no gradients, dropout off) of the plain model and of FAR r=0.4 (and of
    PEFT's LoRA if `lora`: MeZO perturbs and updates only the adapters and the head)."""
    models = {"plain": copy.deepcopy(base).eval(), "far-0.4": CONFIGS["far-0.4"](copy.deepcopy(base)).eval()}
    if lora:
        models["lora"] = CONFIGS["lora"](copy.deepcopy(base)).eval()
    optimizers = {name: far.MeZO(model.parameters(), lr=1e-6, eps=1e-3) for name, model in models.items()}
    data = make_batch(base, batch, length)
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        for round_ in range(warmup + steps):
            shift = round_ % len(models)
            for name in list(models)[shift:] + list(models)[:shift]:
                model, optimizer = models[name], optimizers[name]
                start = time.perf_counter()
                optimizer.step(lambda model=model: model(**data).loss)
                if round_ >= warmup:
                    times[name].append(time.perf_counter() - start)
    plain, split = statistics.median(times["plain"]), statistics.median(times["far-0.4"])
    result = {"plain_s": plain, "far_0.4_s": split, "ratio": split / plain}
    if lora:
        result["lora_s"] = statistics.median(times["lora"])
        result["lora_ratio"] = result["lora_s"] / plain
    return result


def time_forward(base: torch.nn.Module, batch: int, length: int, bf16: bool, steps: int, warmup: int) -> dict:
    """Inference forward of the plain model and of the same model reconfigured at r=0.4."""
    models = {"plain": copy.deepcopy(base).eval(), "far-0.4": CONFIGS["far-0.4"](copy.deepcopy(base)).eval()}
    data = {k: v for k, v in make_batch(base, batch, length).items() if k != "labels"}
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        for round_ in range(warmup + steps):
            for name, model in models.items():
                start = time.perf_counter()
                model(**data)
                if round_ >= warmup:
                    times[name].append(time.perf_counter() - start)
    plain, split = statistics.median(times["plain"]), statistics.median(times["far-0.4"])
    return {"plain_s": plain, "far_0.4_s": split, "ratio": split / plain}


def peak_rss_of(
    model_name: str,
    config: str,
    batch: int,
    length: int,
    bf16: bool,
    optimizer: str = "adamw",
    attention_dropout: float | None = None,
    steps: int = 3,
) -> int:
    """Peak RSS (bytes) of a fresh process that runs `steps` training steps of one configuration."""
    code = (
        "import sys, resource; sys.argv = ['x']; import bench_step as b; "
        f"m = b.build_config({config!r}, b.load_model({model_name!r}, {attention_dropout!r})).train(); "
        f"o = b.make_optimizer(m, {optimizer!r}); "
        f"d = b.make_batch(m, {batch}, {length}); "
        f"[b.train_step(m, o, d, {bf16}) for _ in range({steps})]; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1]) * 1024  # ru_maxrss is in KiB on Linux


def _mib(n: float | None) -> str:
    return "" if n is None else f"{n / 2**20:,.0f}"


def _label(cell: dict) -> str:
    dropout = cell.get("attention_dropout")
    return cell["model"] + ("" if dropout is None else f", attention dropout {dropout:g}")


def _ratio_of(row: dict, key: str) -> str:
    return f"{_mib(row[key])} ({row[key.replace('_bytes', '_ratio')]:.3f})" if key in row else ""


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | batch x len | precision | config | step (s) | ratio to full | paired ratio, median (IQR) "
        "| FLOP bound, no depth | FLOP bound | roofline | paired − roofline | roofline step (s) "
        "| kept for backward, MiB (ratio) | peak live, MiB (ratio) | trainable params | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results:
        for name, row in cell["configs"].items():
            paired = f"{row['paired_ratio_median']:.3f} ({row['paired_ratio_q1']:.3f}–{row['paired_ratio_q3']:.3f})"
            lines.append(
                f"| {_label(cell)} | {cell['batch']}x{cell['length']} | {cell['precision']} | {name} | "
                f"{row['median_step_s']:.3f} | {row['ratio_to_full']:.3f} | {paired} | "
                f"{row['flop_bound_ratio_no_depth']:.3f} | {row['flop_bound_ratio']:.3f} | "
                f"{row['roofline_ratio']:.3f} | "
                f"{row['paired_ratio_median'] - row['roofline_ratio']:+.3f} | {row['roofline_step_s']:.3f} | "
                f"{_ratio_of(row, 'saved_for_backward_bytes')} | {_ratio_of(row, 'peak_live_bytes')} | "
                f"{row['trainable_parameters']:,} | {_mib(row.get('peak_rss_bytes'))} |"
            )
    lines += ["", roofline_markdown(results)]
    with_forward = [cell for cell in results if "forward" in cell]
    if with_forward:
        lines += [
            "",
            "| model | batch x len | precision | no-grad forward: plain (s) | FAR r=0.4 (s) | ratio "
            "| MeZO step: plain (s) | FAR r=0.4 (s) | ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for cell in with_forward:
        f, z = cell["forward"], cell["mezo"]
        lines.append(
            f"| {_label(cell)} | {cell['batch']}x{cell['length']} | {cell['precision']} | "
            f"{f['plain_s']:.3f} | {f['far_0.4_s']:.3f} | {f['ratio']:.3f} | "
            f"{z['plain_s']:.3f} | {z['far_0.4_s']:.3f} | {z['ratio']:.3f} |"
        )
    with_lora = [cell for cell in with_forward if "lora_s" in cell["mezo"]]
    if with_lora:
        lines += [
            "",
            "| model | batch x len | precision | MeZO step: plain (s) | LoRA (s) | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for cell in with_lora:
            z = cell["mezo"]
            lines.append(
                f"| {_label(cell)} | {cell['batch']}x{cell['length']} | {cell['precision']} | "
                f"{z['plain_s']:.3f} | {z['lora_s']:.3f} | {z['lora_ratio']:.3f} |"
            )
    return "\n".join(lines)


TERMS = {
    "forward_products": "fwd",
    "input_grad_products": "dX",
    "weight_grad_products": "dW",
    "attention_products": "attn",
    "streamed_bytes": "bytes",
    "mapped_bytes": "mapped",
    "dropout": "dropout",
    "optimizer_tensors": "tensors",
    "embedding": "emb",
}


def roofline_markdown(results: list[dict]) -> str:
    """The calibrated rates of each cell, and each configuration's roofline terms in milliseconds."""
    lines = [
        "Roofline rates (medians of the calibration rounds): F in GFLOP/s (forward, dX, dW, attention), "
        "B and P in GB/s, R in M dropout elements/s, t_tensor in µs per AdamW tensor, t_emb in ms per word-embedding "
        "step (its elements times t_embedding).",
        "",
        "| model | batch x len | precision | F fwd | F dX | F dW | F attn | B | P | R | t_tensor | t_emb |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results:
        r = cell["rates"]
        lines.append(
            f"| {_label(cell)} | {cell['batch']}x{cell['length']} | {cell['precision']} | "
            f"{r['forward_flops_per_s'] / 1e9:.1f} | {r['input_grad_flops_per_s'] / 1e9:.1f} | "
            f"{r['weight_grad_flops_per_s'] / 1e9:.1f} | {r['attention_flops_per_s'] / 1e9:.1f} | "
            f"{r['bytes_per_s'] / 1e9:.2f} | {r['mapped_bytes_per_s'] / 1e9:.2f} | "
            f"{r['dropout_elements_per_s'] / 1e6:.1f} | {r['seconds_per_tensor'] * 1e6:.0f} | "
            f"{r.get('seconds_per_embedding_element', 0.0) * cell.get('embedding_elements', 0) * 1e3:.0f} |"
        )
    lines += [
        "",
        "Roofline terms (ms): " + ", ".join(f"{short} = {long}" for long, short in TERMS.items()) + ".",
        "",
        "| model | batch x len | precision | config | " + " | ".join(TERMS.values()) + " | total | measured |",
        "|---|---|---|---|" + "---|" * (len(TERMS) + 2),
    ]
    for cell in results:
        for name, row in cell["configs"].items():
            terms = " | ".join(f"{row['roofline_terms_s'].get(key, 0.0) * 1e3:.0f}" for key in TERMS)
            lines.append(
                f"| {_label(cell)} | {cell['batch']}x{cell['length']} | {cell['precision']} | {name} | {terms} | "
                f"{row['roofline_step_s'] * 1e3:.0f} | {row['median_step_s'] * 1e3:.0f} |"
            )
    return "\n".join(lines)


def cpu_flags() -> dict:
    """What decides bf16 speed here: the CPU model, its vector and matrix extensions, and what torch makes of them."""
    info = cpu()
    return {"cpu": info["cpu"], "flags": info["cpu_flags"], "native_bf16": native_bf16()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minilm"], choices=["minilm", "distilbert"])
    parser.add_argument("--shapes", nargs="+", default=["32x64", "32x128"], help="batch x length, e.g. 32x64")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=[name for name in CONFIGS if name not in OPTIONAL_CONFIGS],
        help=f"of {', '.join(CONFIGS)}, far-<R>, far-<R>{FROZEN_EMB}",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--steps-only",
        action="store_true",
        help="time the training steps only: no no-grad forward, no MeZO, no per-step memory",
    )
    parser.add_argument("--memory", action="store_true", help="also measure peak RSS, one process per configuration")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="wall", help="time steps in wall seconds or in CPU seconds (cpu)"
    )
    parser.add_argument(
        "--attention-dropout", type=float, default=None, help="override the model's attention dropout (e.g. 0.0)"
    )
    add_output_argument(
        parser, results_dir(__file__) / "bench_step", "the reports' path without suffix (.json and .md are written)"
    )
    args = parser.parse_args(argv)
    if "full" not in args.configs:
        args.configs.insert(0, "full")

    torch.set_num_threads(torch.get_num_threads())
    results = []
    for model_name in args.models:
        base = load_model(model_name, args.attention_dropout)
        for shape in args.shapes:
            batch, length = map(int, shape.lower().split("x"))
            for precision in args.precisions:
                bf16 = precision == "bf16"
                cell = {"model": model_name, "batch": batch, "length": length, "precision": precision}
                if args.attention_dropout is not None:
                    cell["attention_dropout"] = args.attention_dropout
                print(f"[{model_name} {shape} {precision}] timing {len(args.configs)} configurations...", flush=True)
                timed = time_cell(
                    base,
                    args.configs,
                    batch,
                    length,
                    bf16,
                    args.steps,
                    args.warmup,
                    args.optimizer,
                    not args.steps_only,
                    args.clock,
                )
                cell.update(timed)
                if not args.steps_only:
                    cell["forward"] = time_forward(base, batch, length, bf16, args.steps, args.warmup)
                    cell["mezo"] = time_mezo(base, batch, length, bf16, args.steps, args.warmup, "lora" in args.configs)
                if args.memory:
                    for name in args.configs:
                        cell["configs"][name]["peak_rss_bytes"] = peak_rss_of(
                            model_name, name, batch, length, bf16, args.optimizer, args.attention_dropout
                        )
                results.append(cell)
                print(markdown([cell]), flush=True)
    meta = {
        "command": command_line(__file__, argv),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "optimizer": args.optimizer,
        "clock": args.clock,
        **cpu_flags(),
        "max_rss_of_this_process_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "machine": machine(),
    }
    write_report(args.output.with_suffix(".json"), {"meta": meta, "results": results})
    args.output.with_suffix(".md").write_text(
        f"`{meta['command']}` (torch {meta['torch']}, {meta['threads']} threads, {meta['optimizer']}; "
        f"CPU: {meta['cpu']}, flags {' '.join(meta['flags'])}, native bf16: {meta['native_bf16']})\n\n"
        f"{markdown(results)}\n"
    )
    print(f"wrote {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
