"""Does MeZO train PEFT's LoRA parameters? Short SST-2 runs: MeZO on LoRA against MeZO on every weight.

Each arm is one `far glue --task sst2 --optimizer mezo` process (2,000 training sentences, batch 16, the
dev set of 872 sentences), cached under `<output>/runs/` (default output: experiments/results/mezo_lora/).
The summary gives the dev accuracy beside the majority class's, the mean loss of the first and the last
10% of the steps, and seconds per step (separate processes: the side-by-side step ratio is
experiments/bench_step.py's).

    python experiments/mezo_lora.py --steps 300 --arms lora-mezo-lr1e-4 lora-mezo-lr1e-3   # committed (~4 min)
    python experiments/mezo_lora.py                      # with MeZO on every weight (~1.2 s a step here)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from harness import add_output_argument, command_line, machine, results_dir, run_far_unless_done, write_report

SETUP = "glue --task sst2 --optimizer mezo --max-train-samples 2000 --batch-size 16 --no-save-model --no-progress"
ARMS: dict[str, list[str]] = {
    # MeZO on every weight at far's MeZO default rate.
    "full-mezo-lr1e-5": ["--method", "full", "--lr", "1e-5"],
    # MeZO on LoRA (r=8, query/value) and the head: far fewer perturbed weights take a larger rate.
    "lora-mezo-lr1e-4": ["--method", "lora", "--lr", "1e-4"],
    "lora-mezo-lr1e-3": ["--method", "lora", "--lr", "1e-3"],
}


def run_arm(name: str, steps: int, runs_dir: Path) -> dict:
    out = runs_dir / name
    record = run_far_unless_done([*SETUP.split(), *ARMS[name], "--max-steps", str(steps)], out)
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    tenth = max(1, len(losses) // 10)
    labels = [line.split("\t")[2] for line in (out / "predictions.tsv").read_text().splitlines()[1:]]
    return {
        "accuracy": record["metrics"]["accuracy"],
        "majority_accuracy": Counter(labels).most_common(1)[0][1] / len(labels),
        "first_tenth_loss": statistics.fmean(losses[:tenth]),
        "last_tenth_loss": statistics.fmean(losses[-tenth:]),
        "steps": record["steps"],
        "seconds_per_step": record["training_seconds"] / record["steps"],
        "trainable_parameters": record["trainable_parameters"],
        "lr": record["hyperparameters"]["lr"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=600)
    add_output_argument(parser, results_dir(__file__), "the folder: runs/ and mezo_lora.{json,md}")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    rows = {name: run_arm(name, args.steps, args.output / "runs") for name in args.arms}
    lines = [
        "| arm | lr | trainable params | dev accuracy | majority class | loss, first 10% | loss, last 10% | s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['lr']:g} | {r['trainable_parameters']:,} | {100 * r['accuracy']:.2f} | "
            f"{100 * r['majority_accuracy']:.2f} | {r['first_tenth_loss']:.4f} | {r['last_tenth_loss']:.4f} | "
            f"{r['seconds_per_step']:.3f} |"
        )
    table = "\n".join(lines)
    report = {"command": command, "setup": SETUP, "arms": rows, "machine": machine()}
    write_report(args.output / "mezo_lora.json", report)
    (args.output / "mezo_lora.md").write_text(
        f"`{command}`\n\nSetup: `far {SETUP} --max-steps {args.steps}`\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
