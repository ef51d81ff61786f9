"""The causal-LM default arm, read from held-out training data: `llm_fewshot_time.py`'s seed-0 grids ranked by
validation accuracy, never by the dev accuracy that docs/llm.md reports.

Each arm's grid run at its learning-rate pick (the grid's own rule: best validation accuracy, ties lower
validation loss) is read at its last step (`--grid-steps`). Arms are ranked by that validation accuracy
(k sentences per class of SST-2's training data, disjoint from the k trained on); ties go to the arm that
took fewer CPU seconds, since the question is accuracy on the clock. Dev accuracy is printed beside it as
the confirmation, not used. No run is made: the grids' curves are read from `--curves`.

    python experiments/llm_arm_choice.py    # -> results/llm_fewshot_time/arm_choice.{json,md}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import add_output_argument
from llm_fewshot_time import ARMS, RESULTS, case_name, load_curves, pick_lr


def ranked_arms(curves: dict[str, list[dict]], grid_steps: int) -> list[dict]:
    """Per (model, k): each arm's pick, its grid's last evaluation, and its rank on validation accuracy."""
    rows = []
    for model, k in sorted({(c[0]["model"], c[0]["k"]) for c in curves.values()}):
        found = []
        for arm in ARMS:
            picked = pick_lr(curves, model, k, arm, grid_steps)
            if picked is None:
                continue
            last = curves[case_name(model, k, arm, 0, picked[0], grid_steps)][-1]
            found.append(
                {
                    "model": model,
                    "k": k,
                    "arm": arm,
                    "lr": picked[0],
                    "validation_accuracy": last["validation_accuracy"],
                    "validation_loss": last["validation_loss"],
                    "seconds": last["seconds"],
                    "dev_accuracy": last["accuracy"],
                }
            )
        found.sort(key=lambda r: (-r["validation_accuracy"], r["seconds"]))
        for rank, row in enumerate(found, 1):
            row["rank"] = rank
        rows += found
    return rows


def markdown(rows: list[dict], grid_steps: int) -> str:
    lines = [
        f"# The causal-LM arm on held-out data: seed-0 grids, {grid_steps} steps, ranked by validation accuracy "
        "(ties: fewer CPU seconds)",
        "",
        "| model | k | rank | arm | lr | validation accuracy | validation loss | CPU s | dev accuracy (not used) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['k']} | {r['rank']} | {r['arm']} | {r['lr']:g} | "
            f"{100 * r['validation_accuracy']:.1f} | {r['validation_loss']:.3f} | {r['seconds']:.0f} | "
            f"{100 * r['dev_accuracy']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", type=Path, default=RESULTS / "curves", help="llm_fewshot_time.py's curves")
    parser.add_argument("--grid-steps", type=int, default=100)
    add_output_argument(parser, RESULTS / "arm_choice.json", "the ranking (.json, .md beside it)")
    args = parser.parse_args(argv)
    rows = ranked_arms(load_curves(args.curves), args.grid_steps)
    if not rows:
        parser.error(f"no seed-0 grid of {args.grid_steps} steps in {args.curves}: run llm_fewshot_time.py first")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"grid_steps": args.grid_steps, "rows": rows}, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(rows, args.grid_steps))
    print(markdown(rows, args.grid_steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
