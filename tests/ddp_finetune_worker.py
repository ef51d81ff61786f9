"""Launched under torchrun: `far.finetune` with `Parallel.from_environment()` (gloo, CPU), the engine's DDP path.

`ddp_finetune_worker.py OUT ONE_PROCESS_CHECKPOINT [fsdp]` (tests/test_finetune_ddp.py, with `fsdp`
tests/test_finetune_fsdp.py) runs, in every process: `OUT/fresh`, a fresh FAR "auto" run with checkpoints;
`OUT/resumed`, the same run resumed from a checkpoint that one process wrote (with `fsdp` also
`OUT/resumed-sharded`, from `OUT/fresh`'s step 3); then each run of `VARIANTS` (with `fsdp`: of
`SHARDED_VARIANTS`) into `OUT/<name>`. The first process saves each run's final weights to
`<run>/final.pt`; with `fsdp`, every process checks that the model came back plain.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import torch
from conftest import tiny_examples, tiny_model  # this script's folder, tests/, is on the path
from torch.distributed.tensor import DTensor

import far
from far.training.distributed import Parallel

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# Batches of 8 from 24 examples: 3 steps an epoch; priming 2 steps; a checkpoint every 3 steps.
RUN = dict(max_steps=6, batch_size=8, lr=1e-3, priming=2, checkpoint_every=3, keep_checkpoints=None, progress=False)
VARIANTS = {
    # Batches of 4 accumulated 2 to a step (the gradients meet once a step), scored by gradient priming.
    "accumulated": dict(batch_size=4, grad_accum=2, priming_scores="gradient"),
    # MeZO after AdamW's priming: only the losses meet.
    "mezo": dict(optimizer="mezo", lr=1e-3),
}
SHARDED_VARIANTS = {name: VARIANTS[name] for name in ("accumulated",)}  # MeZO is refused sharded


def loss_on_held_out(model: torch.nn.Module) -> dict[str, float]:
    examples = tiny_examples(6, seed=1)
    batch = {key: torch.stack([e[key] for e in examples]) for key in ("input_ids", "attention_mask", "labels")}
    return {"loss": float(model(**batch).loss)}


def run(out: Path, parallel: Parallel | None, resume_from: Path | None = None, **changes) -> torch.nn.Module:
    """The run every test compares: a tiny BERT without dropout, FAR's automatic configuration, AdamW; `changes`
    replace options of `RUN`."""
    model = tiny_model("bert", **NO_DROPOUT)
    far.finetune(
        model,
        tiny_examples(),
        "auto",
        eval_fn=loss_on_held_out,
        output_dir=out,
        resume_from=resume_from,
        parallel=parallel,
        **{**RUN, **changes},
    )
    return model


def main(out: str, checkpoint: str, mode: str = "ddp") -> NoReturn:
    parallel = Parallel.from_environment(shard=mode == "fsdp")
    runs = [("fresh", None, {}), ("resumed", Path(checkpoint), {})]
    if parallel.shard:  # and a sharded checkpoint, resumed sharded
        runs.append(("resumed-sharded", Path(out) / "fresh" / "checkpoints" / "step-3", {}))
    variants = SHARDED_VARIANTS if parallel.shard else VARIANTS
    for name, resume_from, changes in [*runs, *((name, None, changes) for name, changes in variants.items())]:
        model = run(Path(out) / name, parallel, resume_from, **changes)
        if parallel.shard:  # gathered back into the plain model: its own class, whole tensors
            assert type(model).__name__ == "BertForSequenceClassification", type(model)
            assert not any(isinstance(p, DTensor) for p in model.parameters())
        if parallel.is_main:
            torch.save(model.state_dict(), Path(out) / name / "final.pt")
    torch.distributed.barrier()  # every process is done: the files are written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of the process group: see ddp_worker.exit_now


if __name__ == "__main__":
    main(*sys.argv[1:4])
