"""Peak memory of fine-tuning against inference: MiniLM, or SmolLM2-135M on SST-2 prompts; each case in its own process.

Cases (every one in a fresh process, `--repeats` times; the table gives the median peak RSS):
    runtime     torch, transformers and far imported, no model (SmolLM2 only: its bytes/parameter baseline)
    inference   forward passes without gradients, as many as MeZO makes
    mezo        MeZO on every weight
    mezo_far    MeZO on FAR's learners
    adamw       ordinary full fine-tuning

MiniLM (all-MiniLM-L6-v2, 2-class head, fp32; batch 64 x 128 random token ids, since memory does not
depend on the text): the training cases run `far.finetune`; mezo_far primes with one MeZO step.

SmolLM2-135M (the packaged GGUF, fp32; real SST-2 training prompts, k=512 per class): mezo_far primes
from gradients (`far.training.gradient_priming`), freezes the embeddings, and reports the priming's and the
training's peaks apart; with lean memory (default) glibc returns freed blocks and the frozen
embedding keeps only the rows in use (`far.training.memory`).

    python experiments/bench_memory.py                          # -> experiments/results/bench_memory/memory_minilm.json
    python experiments/bench_memory.py --model smollm2-135m     # -> experiments/results/bench_memory/llm_memory.json
    python experiments/bench_memory.py --mmap-threshold 131072  # children with MALLOC_MMAP_THRESHOLD_ fixed
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from harness import (
    add_output_argument,
    machine,
    peak_rss_bytes,
    print_case,
    repo_relative,
    reset_peak_rss,
    results_dir,
    run_case,
    write_report,
)
from transformers import AutoModelForSequenceClassification, default_data_collator

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
from far.models import load_causal_lm, resolve_model
from far.training import (
    ffn_parameter_names,
    gradient_scores,
    page_out_after_forward,
    release_freed_memory,
    to_private_memory,
)
from far.training.batches import BatchStream

CASES = ("runtime", "inference", "mezo", "mezo_far", "adamw")
MIB = 2**20


def minilm_case(args: argparse.Namespace) -> dict:
    """One case on MiniLM; the training cases through `far.finetune`."""
    transformers.logging.set_verbosity_error()
    model = AutoModelForSequenceClassification.from_pretrained(resolve_model("minilm"), num_labels=2)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, model.config.vocab_size, (args.steps * args.batch_size, args.length), generator=generator)
    data = [
        {"input_ids": row, "attention_mask": torch.ones(args.length, dtype=torch.long), "labels": torch.tensor(i % 2)}
        for i, row in enumerate(ids)
    ]
    start = time.perf_counter()
    if args.case == "inference":
        model.eval()
        batches = BatchStream(data, args.batch_size, default_data_collator, seed=0).batches()
        with torch.no_grad():
            for _ in range(2 * args.steps):  # MeZO makes two forward passes per step
                (piece,) = next(batches)  # one micro-batch: the whole batch
                model(**piece.batch).loss.item()
    else:
        options = {
            "mezo": dict(optimizer="mezo", retention=None),
            "mezo_far": dict(optimizer="mezo", retention=args.retention, priming=1, priming_optimizer="mezo"),
            "adamw": dict(optimizer="adamw", retention=None),
        }[args.case]
        far.finetune(model, data, max_steps=args.steps, batch_size=args.batch_size, progress=False, **options)
    return {"seconds": time.perf_counter() - start, "parameters": sum(p.numel() for p in model.parameters())}


def smollm2_case(args: argparse.Namespace) -> dict:
    """One case on SmolLM2-135M with SST-2 prompts, memory-lean as `far glue --model smollm2-135m` runs."""
    lean = release_freed_memory() if args.lean_memory else False
    model, tokenizer = load_causal_lm(args.model)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    loss_fn = prompt_loss_fn(label_ids)
    sentences, labels = read_labelled_tsv(Path(args.data_dir) / "glue" / "SST-2" / "train.tsv")
    n_priming = args.priming_batches * args.priming_batch
    chosen = sample_k_shot(labels, args.k, args.seed)[: n_priming + args.steps * args.batch_size]
    examples = encode_prompts(tokenizer, [sentences[i] for i in chosen], [labels[i] for i in chosen], SST2_TEMPLATE)
    collate = PromptCollator(tokenizer.pad_token_id)
    priming = [collate(examples[i : i + args.priming_batch]) for i in range(0, n_priming, args.priming_batch)]
    batches = [collate(examples[i : i + args.batch_size]) for i in range(n_priming, len(examples), args.batch_size)]
    del tokenizer, examples, sentences  # encoded: give their memory back before the model is read
    gc.collect()
    if lean:
        release_freed_memory()
        if args.case in ("inference", "mezo_far"):  # the embedding is read, never written: keep only used rows
            page_out_after_forward(model.get_input_embeddings())
    result = {"lean_memory": lean, "parameters": sum(p.numel() for p in model.parameters())}
    start = time.perf_counter()
    if args.case == "inference":
        with torch.no_grad():
            for b in batches:
                loss_fn(model, b)
    elif args.case == "adamw":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for b in batches:
            loss_fn(model, b).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        if args.case == "mezo_far":
            # Priming and surgery as far.training.prime_and_reconfigure does them, with the peak read in between.
            to_private_memory(model, ffn_parameter_names(model))
            scores = gradient_scores(model, priming, loss_fn)
            result.update(priming_peak_rss_bytes=peak_rss_bytes(), priming_seconds=time.perf_counter() - start)
            reset_peak_rss()
            far.reconfigure(model, far.FARConfig(args.retention, freeze_embeddings=True), scores=scores)
            result["surgery_peak_rss_bytes"] = peak_rss_bytes()
            start = time.perf_counter()
        trainable = [p for p in model.parameters() if p.requires_grad]
        result["perturbed_parameters"] = sum(p.numel() for p in trainable)
        optimizer = far.MeZO(trainable, lr=1e-6, eps=1e-3)
        for b in batches:
            optimizer.step(lambda b=b: loss_fn(model, b))
    result["seconds"] = time.perf_counter() - start
    if "priming_peak_rss_bytes" in result:
        result["training_peak_rss_bytes"] = peak_rss_bytes()
    return result


def child(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    loaded = {} if args.case == "runtime" else (minilm_case if args.model == "minilm" else smollm2_case)(args)
    peak = max(peak_rss_bytes(), loaded.get("priming_peak_rss_bytes", 0))  # VmHWM was reset after priming
    return {"case": args.case, **loaded, "peak_rss_bytes": peak}


def summarise(rows: dict[str, dict]) -> list[str]:
    """Ratios to inference's peak, and for SmolLM2 bytes per parameter above the runtime's."""
    lines, base = [], rows.get("inference", {}).get("peak_rss_bytes")
    runtime = rows.get("runtime", {}).get("peak_rss_bytes")
    for case, row in rows.items():
        if base and case != "runtime":
            row["ratio_to_inference"] = round(row["peak_rss_bytes"] / base, 3)
        if runtime and "parameters" in row:
            row["bytes_per_param_above_runtime"] = round((row["peak_rss_bytes"] - runtime) / row["parameters"], 3)
        spread = "-".join(f"{p / MIB:.0f}" for p in (row["peak_rss_runs"][0], row["peak_rss_runs"][-1]))
        lines.append(
            f"{case:<10} peak {row['peak_rss_bytes'] / MIB:>7.0f} MiB ({spread}), "
            f"{row.get('ratio_to_inference', 1.0):.3f}x inference"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("minilm", "smollm2-135m"), default="minilm")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=None, help="(default: all but runtime for MiniLM)")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per case (default 2 MiniLM, 3 SmolLM2)"
    )
    parser.add_argument(
        "--batch-size",
        "--batch",
        dest="batch_size",
        type=int,
        default=None,
        help="batch size (default 64 MiniLM, 16 SmolLM2)",
    )
    parser.add_argument("--length", type=int, default=128, help="MiniLM: tokens per sequence")
    parser.add_argument("--repeats", type=int, default=None, help="processes per case (default 3 MiniLM, 1 SmolLM2)")
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--priming-batches", type=int, default=16, help="SmolLM2: gradient-priming batches")
    parser.add_argument("--priming-batch", type=int, default=4, help="SmolLM2: examples per gradient-priming batch")
    parser.add_argument("--k", type=int, default=512, help="SmolLM2: examples per class of the k-shot training set")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-lean-memory", dest="lean_memory", action="store_false", help="SmolLM2: see far.training.memory"
    )
    parser.add_argument("--mmap-threshold", type=int, help="run the cases with MALLOC_MMAP_THRESHOLD_ set to this")
    add_output_argument(
        parser,
        None,
        f"the JSON report (default: per model, {repo_relative(results_dir(__file__))}/memory_minilm.json or "
        "llm_memory.json)",
        aliases=("--out",),
    )
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # internal: run one case here
    args = parser.parse_args(argv)
    llm = args.model != "minilm"
    args.steps = args.steps or (3 if llm else 2)
    args.batch_size = args.batch_size or (16 if llm else 64)
    if args.case:
        print_case(child(args))
        return 0

    repeats = args.repeats or (1 if llm else 3)
    cases = args.cases or (list(CASES) if llm else list(CASES[1:]))
    env = dict(os.environ)
    if args.mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    if llm:
        resolve_model(args.model)  # build the dequantised cache now, in its own process, if it is missing
    forwarded = list(argv if argv is not None else sys.argv[1:])
    forwarded += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    rows = {}
    for case in cases:
        runs = [run_case(__file__, [*forwarded, "--case", case], env) for _ in range(repeats)]
        peaks = sorted(r["peak_rss_bytes"] for r in runs)
        rows[case] = {**runs[0], "peak_rss_bytes": statistics.median(peaks), "peak_rss_runs": peaks}
        print(f"  {case}: peaks {[round(p / MIB) for p in peaks]} MiB", file=sys.stderr, flush=True)
    for line in summarise(rows):
        print(line)
    default = results_dir(__file__) / ("llm_memory.json" if llm else "memory_minilm.json")
    if args.mmap_threshold:
        default = default.with_stem(f"{default.stem}_mmap{args.mmap_threshold}")
    setup = {k: v for k, v in vars(args).items() if k not in ("case", "output")}
    setup.update(repeats=repeats, malloc_mmap_threshold=env.get("MALLOC_MMAP_THRESHOLD_"))
    write_report(args.output or default, {"setup": setup, "machine": machine(), "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
