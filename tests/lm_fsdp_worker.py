"""Launched under torchrun by tests/test_lm_train_fsdp.py: AdamW steps of a tiny lean Llama with its AdamW state
shared out over the processes (`Parallel(shard=True)`, `far.llm.owned_adamw`).

`lm_fsdp_worker.py OUT WHOLE_STATE`: every process trains as `train` says, on its share of each global batch, then
writes to `OUT/rank-<r>.pt` what it trained, whether its frozen weights moved, how many values of AdamW's moments it
holds, the optimizer state its `state()` gives (whole in the first process), and how many it holds once it loads
`WHOLE_STATE` (a one-process run's optimizer state).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import torch
from ddp_worker import exit_now  # this script's folder, tests/, is on the path
from test_lm_train import chunks, lean_and_hf

from far.llm.compact import CompactWeight
from far.llm.lean_far import set_trainable
from far.llm.lean_model import LeanCausalLM
from far.llm.prefix import PrefixCache
from far.llm.text_steps import TextSteps
from far.training.distributed import Parallel

STEPS, ROWS, MICRO = 3, 5, 2  # 5 rows a step: shares of 2 and 3, so one and two micro-batches


def weights(model: LeanCausalLM, trainable: bool) -> dict[str, torch.Tensor]:
    """The trained weights, or the frozen ones and the embedding, by name (copies)."""
    found = {
        name: m.stored.detach().clone()
        for name, m in model.named_modules()
        if isinstance(m, CompactWeight) and m.trainable == trainable
    }
    if not trainable:
        found.update({f"embed_tokens.{n}": p.detach().clone() for n, p in model.embed_tokens.named_parameters()})
    return found


def model_and_steps(parallel: Parallel) -> tuple[LeanCausalLM, TextSteps]:
    model = lean_and_hf("llama")[0]
    set_trainable(model, "all", torch.float32, frozen_layers=1)
    return model, TextSteps(model, "adamw", 3e-2, PrefixCache(model), weight_decay=0.01, parallel=parallel)


def train(parallel: Parallel) -> tuple[LeanCausalLM, TextSteps]:
    """`STEPS` AdamW steps on seeded batches of `ROWS` chunks, this process's share of each in micro-batches."""
    model, steps = model_and_steps(parallel)
    for step in range(STEPS):
        ids = chunks(seed=step, n=ROWS)[parallel.share(range(ROWS))]
        steps([ids[i : i + MICRO] for i in range(0, len(ids), MICRO)], whole=ROWS)
    return model, steps


def main(out: str, whole_state: str) -> NoReturn:
    parallel = Parallel.from_environment(shard=True)
    frozen = weights(lean_and_hf("llama")[0], trainable=False)
    model, steps = train(parallel)
    report = {
        "trained": weights(model, trainable=True),
        "frozen_unmoved": all(torch.equal(frozen[k], v) for k, v in weights(model, trainable=False).items()),
        "held": steps.adamw.held_values(),
        "state": steps.state(),
    }
    _, loaded = model_and_steps(parallel)
    loaded.load(torch.load(whole_state, weights_only=True))
    report["held_after_load"] = loaded.adamw.held_values()
    torch.save(report, Path(out) / f"rank-{parallel.rank}.pt")
    torch.distributed.barrier()  # every process is done: the files are written
    exit_now(0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
