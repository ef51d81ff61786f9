"""Peak memory of fine-tuning SmolLM2-135M on SST-2 prompts: each case in its own process.

Cases: the runtime alone (torch, transformers and far imported, no model), inference, MeZO, MeZO +
FAR (gradient priming, surgery, MeZO on the learners), and AdamW full fine-tuning for contrast. All
use the same batches of real SST-2 training prompts (k=512 per class, sampled with the seed) and
fp32 weights. Peak RSS is the kernel's high-water mark (VmHWM) of the case's process; for MeZO +
FAR the priming's peak and the training's peak are also reported apart (the mark is reset between
them through /proc/self/clear_refs), and the whole process's peak is the larger of the two.

    python experiments/bench_llm_memory.py                      # all cases -> experiments/results/llm_memory.json
    python experiments/bench_llm_memory.py --batch 16 --steps 3 --threads 1

The dequantised model cache must exist or is built first (in a child process, so no case pays for it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CASES = ("runtime", "inference", "mezo", "mezo_far", "adamw")
GB = 1e9


def peak_rss() -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def sst2_examples(data_dir: Path, tokenizer, n: int, k: int, seed: int) -> list[dict]:
    """The first `n` examples of the k-shot SST-2 training set (csv only: no `datasets` import)."""
    from far.llm.prompts import SST2_TEMPLATE, encode_prompts, read_labelled_tsv, sample_k_shot

    sentences, labels = read_labelled_tsv(data_dir / "glue" / "SST-2" / "train.tsv")
    chosen = sample_k_shot(labels, k, seed)[:n]
    return encode_prompts(tokenizer, [sentences[i] for i in chosen], [labels[i] for i in chosen], SST2_TEMPLATE)


def run_case(args: argparse.Namespace) -> dict:
    import torch
    import transformers  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401  (the model's code is runtime too)

    import far
    from far.llm import load_causal_lm
    from far.llm.memory import page_out_after_forward, release_freed_memory, to_private_memory
    from far.llm.priming import ffn_parameter_names, gradient_scores
    from far.llm.prompts import SST2_TEMPLATE, PromptCollator, label_logits, label_word_ids, prompt_loss_fn
    from far.training import MeZO

    torch.set_num_threads(args.threads)
    result: dict = {"case": args.case, "lean_memory": release_freed_memory() if args.lean_memory else False}
    if not args.lean_memory:
        release_freed_memory = lambda: None  # noqa: E731
    if args.case == "runtime":
        result["peak_rss_bytes"] = peak_rss()
        return result
    model, tokenizer = load_causal_lm(args.model)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    loss_fn = prompt_loss_fn(label_ids)
    n_priming = args.priming_batches * args.priming_batch
    examples = sst2_examples(Path(args.data_dir), tokenizer, n_priming + args.steps * args.batch, args.k, args.seed)
    collate = PromptCollator(tokenizer.pad_token_id)
    priming = [collate(examples[i : i + args.priming_batch]) for i in range(0, n_priming, args.priming_batch)]
    batches = [collate(examples[i : i + args.batch]) for i in range(n_priming, len(examples), args.batch)]
    del tokenizer, examples  # the data is encoded: give the tokenizer's memory back before the model is read
    gc.collect()
    release_freed_memory()
    if args.lean_memory and args.case in (
        "inference",
        "mezo_far",
    ):  # embedding read, never written: keep only used rows
        page_out_after_forward(model.get_input_embeddings())
    result["tokens_per_batch"] = [list(b["input_ids"].shape) for b in batches]
    result["parameters"] = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    if args.case == "inference":
        with torch.no_grad():
            for b in batches:
                label_logits(model, b["input_ids"], b["attention_mask"], label_ids)
    elif args.case in ("mezo", "mezo_far"):
        if args.case == "mezo_far":
            # Priming and surgery as prime_and_reconfigure does them, with the peak read in between.
            to_private_memory(model, ffn_parameter_names(model))
            scores = gradient_scores(model, priming, loss_fn)
            result["priming_peak_rss_bytes"] = peak_rss()
            result["priming_seconds"] = time.perf_counter() - start
            reset_peak_rss()
            far.reconfigure(model, args.retention, scores=scores, freeze_embeddings=True)
            result["surgery_peak_rss_bytes"] = peak_rss()
            start = time.perf_counter()
        trainable = [p for p in model.parameters() if p.requires_grad]
        result["perturbed_parameters"] = sum(p.numel() for p in trainable)
        optimizer = MeZO(trainable, lr=1e-6, eps=1e-3)
        for b in batches:
            optimizer.step(lambda b=b: loss_fn(model, b))
    elif args.case == "adamw":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for b in batches:
            loss_fn(model, b).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        raise ValueError(f"unknown case {args.case!r}; one of {', '.join(CASES)}")
    result["seconds_per_step"] = (time.perf_counter() - start) / len(batches)
    result["peak_rss_bytes"] = max(peak_rss(), result.get("priming_peak_rss_bytes", 0))
    if "priming_peak_rss_bytes" in result:
        result["training_peak_rss_bytes"] = peak_rss()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="batches (optimizer steps) per case")
    parser.add_argument("--priming-batches", type=int, default=16, help="gradient-priming batches of MeZO + FAR")
    parser.add_argument("--priming-batch", type=int, default=4, help="examples per gradient-priming batch")
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--k", type=int, default=512, help="examples per class of the k-shot training set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-lean-memory",
        dest="lean_memory",
        action="store_false",
        help="leave glibc's malloc and the embedding's file pages alone (see far.llm.memory)",
    )
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--out", default="experiments/results/llm_memory.json")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # internal: run one case here
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args)))
        return 0

    from far.llm import resolve_causal_lm

    resolve_causal_lm(args.model)  # build the cache now, in its own process, if it is missing
    results = {}
    for case in args.cases:
        cmd = [sys.executable, __file__, "--case", case, *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{case:>10}: peak RSS {results[case]['peak_rss_bytes'] / GB:.3f} GB", flush=True)
    summary = summarise(results)
    for line in summary["lines"]:
        print(line)
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("case", "out")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "cases": results,
        "summary": {k: v for k, v in summary.items() if k != "lines"},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def summarise(results: dict) -> dict:
    out: dict = {"lines": []}
    base = results.get("runtime", {}).get("peak_rss_bytes")
    params = next((r["parameters"] for r in results.values() if "parameters" in r), None)
    for case, r in results.items():
        if case == "runtime" or base is None or params is None:
            continue
        per_param = (r["peak_rss_bytes"] - base) / params
        out[f"{case}_bytes_per_param_above_runtime"] = round(per_param, 3)
        out["lines"].append(f"{case:>10}: {per_param:.2f} bytes/param above the runtime's {base / GB:.3f} GB")
    if "inference" in results:
        for case in ("mezo", "mezo_far", "adamw"):
            if case in results:
                ratio = results[case]["peak_rss_bytes"] / results["inference"]["peak_rss_bytes"]
                out[f"{case}_over_inference"] = round(ratio, 3)
                out["lines"].append(f"{case:>10}: {ratio:.3f}x the inference peak")
    if "mezo_far" in results:
        peak = results["mezo_far"]["peak_rss_bytes"]
        out["mezo_far_within_1GB"] = peak <= GB
        out["lines"].append(
            f"MeZO + FAR peak {peak / GB:.3f} GB ({peak / 2**30:.3f} GiB): {'within' if peak <= GB else 'over'} 1.0 GB"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
