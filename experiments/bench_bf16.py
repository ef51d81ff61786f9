"""bf16 on a CPU: FAR's AdamW step in fp32 and under bf16 autocast, with frozen weights also stored in bf16.

Every arm (a configuration of experiments/bench_step.py at one precision) is built once and timed interleaved,
round after round in a rotated order, in this one process, on one thread; each reports the median of its timed
steps after warm-up, and the median of its per-round ratios to FAR's fp32 step (the target: the bf16 FAR step at
<= 0.90 of it) and to full fine-tuning's step at the same precision.

The `+bf16-frozen` arms store every frozen `nn.Linear` and `nn.Embedding` in bf16 once, so that autocast has no
frozen weight left to cast in a step (FAR's split layers already cast their frozen part once and keep it, see
far.layers.SplitLinear). A profile of one step per profiled arm then says where the time goes: matrix products,
dropout's random masks, casts of weights (tensors shaped like a parameter), casts and copies of activations,
the optimizer, and the rest.

    python experiments/bench_bf16.py                       # MiniLM, 32x64, one thread
    python experiments/bench_bf16.py --steps 20 --clock wall
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

import torch
from bench_step import CLOCKS, build_config, load_model, make_batch, make_optimizer, train_step
from harness import add_output_argument, command_line, cpu, lscpu_flags, machine, results_dir, write_report
from torch import nn
from torch.profiler import ProfilerActivity, profile

from far.training.precision import choose_precision

FAR = "far-0.2+frozen-emb"
DEPTH = "far-0.2+frozen-emb+bottom-3"
BF16_FROZEN = "+bf16-frozen"
# (configuration of bench_step, precision); a configuration ending in +bf16-frozen stores its frozen weights in bf16.
ARMS = (
    ("full", "fp32"),
    ("full", "bf16"),
    (FAR, "fp32"),
    (FAR, "bf16"),
    (FAR + BF16_FROZEN, "bf16"),
    (DEPTH, "fp32"),
    (DEPTH, "bf16"),
    (DEPTH + BF16_FROZEN, "bf16"),
    # r=0.4 with the embeddings trained: where FAR's bf16 step took 0.944 of full's on another avx512_bf16 CPU.
    ("far-0.4", "fp32"),
    ("far-0.4", "bf16"),
)
PROFILED = (
    ("full", "bf16"),
    ("far-0.4", "bf16"),
    (FAR, "fp32"),
    (FAR, "bf16"),
    (DEPTH, "bf16"),
    (DEPTH + BF16_FROZEN, "bf16"),
)
PROFILED_STEPS = 3
PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
DROPOUT = {"aten::bernoulli_", "aten::native_dropout", "aten::native_dropout_backward"}
COPIES = {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous"}


def store_frozen_bf16(model: nn.Module) -> nn.Module:
    """Every `nn.Linear` and `nn.Embedding` whose tensors are all frozen, stored in bf16 (in place)."""
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if isinstance(module, (nn.Linear, nn.Embedding)) and params and not any(p.requires_grad for p in params):
            module.to(torch.bfloat16)
    return model


def build_arm(base: nn.Module, config: str) -> nn.Module:
    name = config.removesuffix(BF16_FROZEN)
    model = build_config(name, copy.deepcopy(base)).train()
    return store_frozen_bf16(model) if config.endswith(BF16_FROZEN) else model


def arm_name(config: str, precision: str) -> str:
    return f"{config} {precision}"


def time_arms(base: nn.Module, batch: int, length: int, steps: int, warmup: int, clock: str) -> dict[str, list[float]]:
    """Per arm, its step times round by round (after `warmup` rounds)."""
    arms = {}
    for config, precision in ARMS:
        model = build_arm(base, config)
        arms[arm_name(config, precision)] = (model, make_optimizer(model), precision == "bf16")
    data = make_batch(base, batch, length)
    now = CLOCKS[clock]
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for round_ in range(warmup + steps):
        shift = round_ % len(names)  # no arm always runs first or last in a round
        for name in names[shift:] + names[:shift]:
            model, optimizer, bf16 = arms[name]
            start = now()
            train_step(model, optimizer, data, bf16)
            if round_ >= warmup:
                times[name].append(now() - start)
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict]:
    """Median step per arm; medians of the ratios paired round by round to FAR fp32 and to full at its precision."""
    reference = times[arm_name(FAR, "fp32")]
    rows = {}
    for name, steps in times.items():
        precision = name.rsplit(" ", 1)[1]
        full = times[arm_name("full", precision)]
        rows[name] = {
            "median_step_s": statistics.median(steps),
            "paired_ratio_to_far_fp32": statistics.median(s / r for s, r in zip(steps, reference, strict=True)),
            "paired_ratio_to_full_same_precision": statistics.median(s / f for s, f in zip(steps, full, strict=True)),
            "steps": len(steps),
            "step_times_s": steps,
        }
    return rows


def _category(event, weight_shapes: set[tuple[int, ...]]) -> str:
    key = event.key
    if key in PRODUCTS:
        return "products"
    if key in DROPOUT:
        return "dropout"
    if key in COPIES:
        shape = tuple(event.input_shapes[0]) if event.input_shapes and event.input_shapes[0] else ()
        return "weight casts" if shape in weight_shapes else "activation copies"
    return "other"


def _self_ms(prof) -> float:
    return sum(event.self_cpu_time_total for event in prof.key_averages()) / 1e3


def profile_step(model: nn.Module, data: dict, bf16: bool) -> dict[str, float]:
    """Self CPU milliseconds per step (the mean of `PROFILED_STEPS`, after two unprofiled ones): forward and
    backward by category (see `_category`), and the optimizer's step apart."""
    optimizer = make_optimizer(model)
    for _ in range(2):
        train_step(model, optimizer, data, bf16)
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.t().shape) for p in model.parameters()}
    split: dict[str, float] = {}
    for _ in range(PROFILED_STEPS):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as passes:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(**data).loss
            loss.backward()
        with profile(activities=[ProfilerActivity.CPU]) as update:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for event in passes.key_averages(group_by_input_shape=True):
            category = _category(event, weight_shapes)
            split[category] = split.get(category, 0.0) + event.self_cpu_time_total / 1e3
        split["optimizer"] = split.get("optimizer", 0.0) + _self_ms(update)
    split["total"] = sum(split.values())
    return {k: round(v / PROFILED_STEPS, 2) for k, v in split.items()}


def markdown(rows: dict[str, dict], profiles: dict[str, dict[str, float]]) -> str:
    lines = [
        "| arm | step (s) | paired ratio to FAR fp32 | paired ratio to full, same precision |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['median_step_s']:.3f} | {row['paired_ratio_to_far_fp32']:.3f} | "
            f"{row['paired_ratio_to_full_same_precision']:.3f} |"
        )
    categories = ["products", "dropout", "weight casts", "activation copies", "optimizer", "other", "total"]
    lines += ["", "| profiled arm (ms per step, self CPU) | " + " | ".join(categories) + " |"]
    lines.append("|---|" + "---|" * len(categories))
    for name, split in profiles.items():
        lines.append(f"| {name} | " + " | ".join(f"{split.get(c, 0.0):.0f}" for c in categories) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=["minilm", "distilbert"])
    parser.add_argument("--shape", default="32x64", help="batch x length")
    parser.add_argument("--steps", type=int, default=10, help="timed rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu", help="CPU seconds of this process, or wall")
    add_output_argument(parser, results_dir(__file__) / "bench_bf16", "the reports' path without suffix")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: the ratios of one core, whatever else shares the machine
    batch, length = map(int, args.shape.lower().split("x"))
    base = load_model(args.model)
    load_before = os.getloadavg()  # other jobs on the machine: the ratios are paired, the absolute times are not
    times = time_arms(base, batch, length, args.steps, args.warmup, args.clock)
    rows = summarize(times)
    data = make_batch(base, batch, length)
    profiles = {arm_name(c, p): profile_step(build_arm(base, c), data, p == "bf16") for c, p in PROFILED}
    chosen = choose_precision("auto", torch.device("cpu"))
    bf16_far = rows[arm_name(FAR, "bf16")]["paired_ratio_to_far_fp32"]
    meta = {
        "command": command_line(__file__, argv),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "model": args.model,
        "shape": args.shape,
        "lscpu_flags": lscpu_flags(),
        "load_average_before_and_after": [load_before, os.getloadavg()],
        "auto_precision": chosen.to_dict(),
        "target_bf16_far_over_fp32_far": {"value": bf16_far, "target": 0.90, "met": bf16_far <= 0.90},
        "machine": machine(),
        **{k: v for k, v in cpu().items() if k == "cpu_flags"},
    }
    report = {"meta": meta, "arms": rows, "profiles_ms": profiles}
    write_report(args.output.with_suffix(".json"), report)
    text = markdown(rows, profiles)
    args.output.with_suffix(".md").write_text(
        f"`{meta['command']}` (torch {meta['torch']}, 1 thread, {args.clock} clock, {args.model} {args.shape}; "
        f"CPU: {meta['machine']['cpu']}, flags {' '.join(meta['cpu_flags'])}; auto picks {chosen.name})\n\n{text}\n"
    )
    print(text)


if __name__ == "__main__":
    main()
