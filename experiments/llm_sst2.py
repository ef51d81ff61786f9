"""SmolLM2-135M on SST-2 prompts, MeZO + FAR vs MeZO, on a CPU inside a 1 GB memory budget.

Arms, each in its own process (so each reports its own peak RSS):
- zero_shot: accuracy of the pretrained model (the baseline);
- mezo_far: gradient priming (`far.training.prime_and_reconfigure`, embeddings frozen), then
  MeZO on the learners and the attention/norm weights through `far.finetune`;
- mezo: MeZO on every weight (the MeZO paper's setting), the same steps, batches and schedule.

Training data: k examples per class of SST-2 train (MeZO's k-shot sets, sampled with the seed);
evaluation: SST-2 dev (all 872 sentences, or its first --eval-samples). The prompt is
`<sentence> It was` + ` great`/` terrible`. Training arms run side by side by default (--parallel),
so that their seconds per step are measured under the same load.

    python experiments/llm_sst2.py --steps 150 --lr 1e-5             # -> experiments/results/llm_sst2/llm_sst2.json
    python experiments/llm_sst2.py --arms mezo_far --steps 5 --eval-samples 64 --output /tmp/probe.json
"""

from __future__ import annotations

import argparse
import gc
import os
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
from far.training import page_out_after_forward, prime_and_reconfigure, release_freed_memory

ARMS = ("zero_shot", "mezo_far", "mezo")


def run_arm(args: argparse.Namespace) -> dict:
    release_freed_memory()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokenizer = load_causal_lm(args.model)
    label_ids = label_word_ids(tokenizer, SST2_TEMPLATE)
    glue = Path(args.data_dir) / "glue" / "SST-2"
    sentences, labels = read_labelled_tsv(glue / "dev.tsv")
    n_eval = min(args.eval_samples or len(labels), len(labels))
    dev = encode_prompts(tokenizer, sentences[:n_eval], labels[:n_eval], SST2_TEMPLATE)
    pad = tokenizer.pad_token_id
    if args.arm != "zero_shot":
        sentences, labels = read_labelled_tsv(glue / "train.tsv")
        chosen = sample_k_shot(labels, args.k, seed=args.seed)
        train = encode_prompts(tokenizer, [sentences[i] for i in chosen], [labels[i] for i in chosen], SST2_TEMPLATE)
    del tokenizer, sentences, labels  # all encoded: give their memory back before the model's pages are read
    gc.collect()
    release_freed_memory()
    if args.arm != "mezo":  # the embedding is only read (frozen): keep just the rows in use resident
        page_out_after_forward(model.get_input_embeddings())

    eval_cpu = [0.0]  # CPU seconds spent evaluating, to take out of the training's

    def eval_fn(m):
        t = time.process_time()
        metrics = {"accuracy": accuracy(m, dev, label_ids, pad, batch_size=args.eval_batch)}
        eval_cpu[0] += time.process_time() - t
        return metrics

    result: dict = {"arm": args.arm, "eval_examples": n_eval, "load_seconds": time.perf_counter() - start}
    if args.arm == "zero_shot":
        t = time.perf_counter()
        result["metrics"] = eval_fn(model)
        result["eval_seconds"] = time.perf_counter() - t
        result["eval_cpu_seconds"] = eval_cpu[0]
    else:
        collate, loss_fn = PromptCollator(pad), prompt_loss_fn(label_ids)
        result["train_examples"] = len(train)
        if args.arm == "mezo_far":
            t, t_cpu = time.perf_counter(), time.process_time()
            # Priming batches: the first ones of another seeded order of the same k-shot set.
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + 1)).tolist()
            size = args.priming_batch
            priming = [
                collate([train[i] for i in order[b * size : (b + 1) * size]]) for b in range(args.priming_batches)
            ]
            config = far.FARConfig(args.retention, seed=args.seed, freeze_embeddings=True)
            prime_and_reconfigure(model, priming, loss_fn, config)
            result["gradient_priming"] = {
                "batches": args.priming_batches,
                "batch": size,
                "seconds": time.perf_counter() - t,
                "cpu_seconds": time.process_time() - t_cpu,
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
            eval_fn=eval_fn,
            eval_every=args.eval_every,
            mezo_eps=args.eps,
            seed=args.seed,
            progress=False,
            output_dir=args.log_dir and Path(args.log_dir) / args.arm,
        )
        cpu = time.process_time() - cpu - eval_cpu[0]  # CPU time of the MeZO steps
        result.update(run.to_dict())
        result["seconds_per_step"] = run.training_seconds / max(run.steps, 1)  # wall clock, under the machine's load
        result["cpu_seconds_per_step"] = cpu / max(run.steps, 1)  # load-independent
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("FAR_DATA_DIR", "../shared/data"))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--k", type=int, default=512, help="training examples per class")
    parser.add_argument("--steps", type=int, default=100, help="MeZO steps of each training arm")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--retention", type=float, default=0.4)
    parser.add_argument("--priming-batches", type=int, default=16, help="gradient-priming batches of mezo_far")
    parser.add_argument("--priming-batch", type=int, default=4, help="examples per gradient-priming batch")
    parser.add_argument("--eval-samples", type=int, default=None, help="first N dev sentences (default: all 872)")
    parser.add_argument("--eval-batch", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument("--sequential", dest="parallel", action="store_false", help="run the arms one after another")
    parser.add_argument("--log-dir", default=None, help="where each training arm writes its log.jsonl")
    add_output_argument(parser, results_dir(__file__) / "llm_sst2.json", "the JSON report", aliases=("--out",))
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # internal: run one arm here
    args = parser.parse_args(argv)
    if args.arm:
        print_case(run_arm(args))
        return 0

    resolve_model(args.model)  # build the model cache first, once, in its own process
    forwarded = argv if argv is not None else sys.argv[1:]
    started = time.perf_counter()
    procs = {}
    for arm in args.arms:
        procs[arm] = start_case(__file__, ["--arm", arm, *forwarded])
        if not args.parallel:
            procs[arm].wait()
    results = {}
    for arm, proc in procs.items():
        results[arm] = r = case_result(proc)
        line = f"{arm:>10}: accuracy {r['metrics']['accuracy']:.4f}, peak RSS {r['peak_rss_bytes'] / 1e9:.3f} GB"
        if "steps" in r:
            line += (
                f", {r['steps']} steps, {r['seconds_per_step']:.2f} s/step ({r['cpu_seconds_per_step']:.2f} CPU s/step)"
            )
        print(line, flush=True)
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("arm", "output")},
        "machine": {**machine(), "load_average_at_end": os.getloadavg()},
        "wall_seconds": time.perf_counter() - started,
        "arms": results,
    }
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
