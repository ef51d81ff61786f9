"""Evaluation at inference cost: a GLUE dev split scored in length-sorted batches against the split's own order.

`far.evaluation.labels.LabelEvaluator` sorts the examples by length before batching (and puts the
predictions back in the split's order), so a batch pads to the longest of similar examples instead of the
longest of whatever came together. This times both, interleaved round after round in this one process on
one thread (after a warm-up), and reports each one's median CPU seconds, their ratio and the padded tokens
each one runs, with the metric of each (it must be the same).

    python experiments/bench_eval.py                       # MiniLM, SST-2's dev set, batch 64, one thread
    python experiments/bench_eval.py --task cola --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from harness import add_output_argument, command_line, machine, results_dir, write_report
from transformers import DataCollatorWithPadding

from far.data import get_task, load_glue, tokenize_glue
from far.evaluation import GlueEvaluator
from far.evaluation.labels import column, model_outputs
from far.models import load_model_and_tokenizer


class InSplitOrder(GlueEvaluator):
    """The evaluator without the length sort: batches in the split's order."""

    def __call__(self, model):
        outs = model_outputs(model, self.dataset, self._collate_inputs, self.batch_size, self.bf16)
        logits = torch.cat([out.logits.float().cpu() for _, out in outs]).numpy()
        self.predictions = logits.argmax(-1) if self.label_names else logits[:, 0]
        return self.metric.compute(predictions=self.predictions, references=self.references)


def padded_tokens(lengths: list[int], batch_size: int) -> int:
    return sum(
        max(lengths[i : i + batch_size]) * len(lengths[i : i + batch_size]) for i in range(0, len(lengths), batch_size)
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    add_output_argument(parser, results_dir(__file__) / "bench_eval.json", "the JSON report")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = get_task(args.task)
    model, tokenizer = load_model_and_tokenizer("minilm", task.kind, task.num_labels, seed=0)
    dev = tokenize_glue(load_glue(args.task, args.data_dir)["validation"], tokenizer, task, args.max_length)
    collate = DataCollatorWithPadding(tokenizer)
    arms = {
        "length-sorted": GlueEvaluator(task, dev, collate, batch_size=args.batch_size),
        "split order": InSplitOrder(task, dev, collate, batch_size=args.batch_size),
    }
    lengths = [len(ids) for ids in column(dev, "input_ids")]
    tokens = {
        "length-sorted": padded_tokens(sorted(lengths), args.batch_size),
        "split order": padded_tokens(lengths, args.batch_size),
    }
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    scores = {}
    for name, evaluate in arms.items():  # warm-up
        scores[name] = evaluate(model)
    for r in range(args.rounds):
        for name in list(arms)[r % 2 :] + list(arms)[: r % 2]:
            start = time.process_time()
            arms[name](model)
            seconds[name].append(time.process_time() - start)
    same = bool(np.array_equal(arms["length-sorted"].predictions, arms["split order"].predictions))
    median = {name: statistics.median(s) for name, s in seconds.items()}
    report = {
        "command": command_line(__file__, argv),
        "machine": machine(),
        "task": args.task,
        "examples": len(dev),
        "batch_size": args.batch_size,
        "cpu_seconds": seconds,
        "median_cpu_seconds": median,
        "ratio": median["length-sorted"] / median["split order"],
        "padded_tokens": tokens,
        "real_tokens": sum(lengths),
        "scores": scores,
        "same_predictions": same,
    }
    for name in arms:
        print(
            f"{name:14s} {median[name]:6.2f} CPU s (median of {args.rounds}), {tokens[name]:,} padded tokens, "
            f"{scores[name]}"
        )
    print(f"length-sorted / split order: {report['ratio']:.3f}; the same predictions: {same}")
    write_report(args.output, report)
    return report


if __name__ == "__main__":
    main()
