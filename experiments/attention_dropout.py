"""What attention dropout costs on a CPU, and what turning it off costs in quality.

With attention dropout on (MiniLM's default, 0.1), PyTorch's CPU attention cannot use its fused
kernel: it runs the unfused path and keeps the attention probabilities and their dropout mask for
backward, whatever FAR does with the FFNs. This script fine-tunes the same task with the model's
attention dropout and with none, seed by seed, one process per run, and reports the metric and the
training time; `bench_step.py --attention-dropout 0` gives the memory side.

    python experiments/attention_dropout.py                   # SST-2, 3,000 sentences, FAR r=0.4, seeds 0 1 2
    python experiments/attention_dropout.py --seeds 0 1 --max-train-samples 2000   # the committed result
    python experiments/attention_dropout.py --method full --seeds 0
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness import add_output_argument, command_line, machine, print_case, results_dir, run_case, write_report
from torch import nn

from far.recipes import RunSettings, glue_run, train_and_report


def one_run(task: str, method: str, seed: int, dropout: float | None, samples: int, output: Path) -> dict:
    """Fine-tune and score once in this process (the child's side of `run_case`)."""
    settings = RunSettings(
        method=method,
        seed=seed,
        max_train_samples=samples,
        epochs=1,
        output_dir=str(output),
        save_model=False,
        progress=False,
    )
    run = glue_run(settings, task)
    if dropout is not None:
        # The attention modules read their dropout's p at each forward pass (BERT-style models).
        for module in run.model.modules():
            if type(module).__name__.endswith("SelfAttention") and isinstance(module.dropout, nn.Dropout):
                module.dropout.p = dropout
    record = train_and_report(run)
    return {key: record[key] for key in ("metrics", "priming_seconds", "training_seconds")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--method", default="far")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-train-samples", type=int, default=3000)
    add_output_argument(parser, results_dir(__file__), "the folder: one run folder per case and attention_dropout.json")
    parser.add_argument("--case", nargs=2, metavar=("SEED", "DROPOUT"), help=argparse.SUPPRESS)  # child process
    args = parser.parse_args(argv)

    if args.case:
        seed, dropout = int(args.case[0]), None if args.case[1] == "default" else float(args.case[1])
        label = f"{args.task}-{args.method}-s{seed}-attn{args.case[1]}"
        print_case(one_run(args.task, args.method, seed, dropout, args.max_train_samples, args.output / label))
        return

    base = ["--task", args.task, "--method", args.method, "--max-train-samples", str(args.max_train_samples)]
    base += ["--output", str(args.output)]
    runs = []
    for seed in args.seeds:
        for dropout in ("default", "0"):
            result = run_case(__file__, [*base, "--case", str(seed), dropout])
            runs.append({"seed": seed, "attention_dropout": dropout, **result})
            print(f"seed {seed}, attention dropout {dropout}: {result['metrics']}", flush=True)
    summary = {}
    for dropout in ("default", "0"):
        rows = [r for r in runs if r["attention_dropout"] == dropout]
        metric = next(iter(rows[0]["metrics"]))
        values = [r["metrics"][metric] for r in rows]
        seconds = [r["priming_seconds"] + r["training_seconds"] for r in rows]
        summary[dropout] = {
            "metric": metric,
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "train_seconds_mean": statistics.mean(seconds),
        }
    command = command_line(__file__, argv)
    write_report(
        args.output / "attention_dropout.json",
        {"command": command, "machine": machine(), "runs": runs, "summary": summary},
    )
    for dropout, row in summary.items():
        print(
            f"attention dropout {dropout}: {row['metric']} {row['mean']:.4f} ± {row['std']:.4f}, "
            f"{row['train_seconds_mean']:.0f} s of training"
        )


if __name__ == "__main__":
    main()
