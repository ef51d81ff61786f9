"""Launched under torchrun: a reconfigured tiny model trained with PyTorch DDP (gloo, CPU).

`ddp_worker.py REPORT` (tests/test_ddp.py): a hand-written DDP loop. `ddp_worker.py trainer REPORT
CHECKPOINT OUTPUT_DIR` (tests/test_trainer_ddp.py): the second half of the documented DDP flow, a
`FARTrainer` run with a `FARCallback` resumed from CHECKPOINT, taken at the switch in one process.

Each rank trains on its own batches and its own dropout masks; DDP averages the gradients, so the
replicas must stay identical, and the frozen tensors (which DDP does not even see) must not move.
Rank 0 writes a JSON report to REPORT; the exit code is 0 iff it all held.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from conftest import tiny_examples, tiny_model  # this script's folder, tests/, is on the path
from torch.nn.parallel import DistributedDataParallel
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

import far
from far.training.trainer import FARTrainer


def main(report_path: str) -> NoReturn:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # fail, not hang, if a peer never comes
    rank, world = dist.get_rank(), dist.get_world_size()
    config = AutoConfig.for_model(
        "bert",
        num_labels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        vocab_size=97,
    )
    torch.manual_seed(0)  # the same initial model on every rank
    model = AutoModelForSequenceClassification.from_config(config)
    far.reconfigure(model, retention=0.4, selection="random", seed=0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    learners = {n: p.detach().clone() for n, p in model.named_parameters() if "learner" in n}

    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own data ...
    torch.manual_seed(1 + rank)  # ... and its own dropout
    model.train()
    losses = []
    for _ in range(4):
        ids = torch.randint(3, 97, (4, 8), generator=data)
        labels = torch.randint(0, 3, (4,), generator=data)
        loss = ddp(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    flat = torch.cat(
        [p.detach().flatten() for p in model.parameters()] + [b.flatten().float() for b in model.buffers()]
    )
    replicas = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(replicas, flat)
    all_losses = [None] * world
    dist.all_gather_object(all_losses, losses)
    report = {
        "world_size": world,
        "replicas_identical": all(torch.equal(replicas[0], r) for r in replicas),
        "frozen_unchanged": all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen),
        "learners_moved": all(not torch.equal(p, learners[n]) for n, p in model.named_parameters() if n in learners),
        "ranks_saw_different_losses": all_losses[0] != all_losses[1],
        "n_frozen": len(frozen),
        "n_learner_tensors": len(learners),
    }
    if rank == 0:
        with open(report_path, "w") as f:
            json.dump(report, f)
    dist.barrier()  # every rank is done with the group: the report is written
    exit_now(0 if all(v for k, v in report.items() if isinstance(v, bool)) else 1)


def trainer_main(report_path: str, checkpoint: str, output_dir: str) -> NoReturn:
    class AtStart(TrainerCallback):
        """The tensors as the run starts, once the checkpoint is loaded."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            named = dict(model.named_parameters())
            self.frozen = {n: p.detach().clone() for n, p in named.items() if not p.requires_grad}
            self.learners = {n: p.detach().clone() for n, p in named.items() if "learner" in n}

    seen: list[list[int]] = []

    def collate(features: list[dict]) -> dict:
        seen.append(features[0]["input_ids"].tolist())  # which examples this rank trains on
        return default_data_collator(features)

    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=6,
        per_device_train_batch_size=2,  # x 2 processes: the batch of 4 the first process primed with
        learning_rate=1e-2,
        weight_decay=0.1,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=60,  # fail, not hang, if a peer never comes
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_pin_memory=False,
    )
    at_start = AtStart()
    trainer = FARTrainer(
        model=tiny_model("bert"),
        args=args,
        train_dataset=tiny_examples(),
        data_collator=collate,
        callbacks=[far.FARCallback(retention=0.5, priming=2, stop_at_switch=True), at_start],
    )
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(os.path.join(output_dir, "final"))
    model = trainer.model
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(replicas, flat)
    all_seen = [None] * world
    dist.all_gather_object(all_seen, seen)
    named = dict(model.named_parameters())
    report = {
        "world_size": world,
        "wrapped_in_ddp": type(trainer.model_wrapped).__name__ == "DistributedDataParallel",
        "steps": trainer.state.global_step,
        "ranks_saw_different_batches": all_seen[0] != all_seen[1],
        "replicas_identical": all(torch.equal(replicas[0], r) for r in replicas),
        "frozen_unchanged": all(torch.equal(named[n], v) for n, v in at_start.frozen.items()),
        "learners_moved": all(not torch.equal(named[n], v) for n, v in at_start.learners.items()),
        "n_frozen": len(at_start.frozen),
        "n_learner_tensors": len(at_start.learners),
    }
    if rank == 0:
        with open(report_path, "w") as f:
            json.dump(report, f)
    dist.barrier()  # every rank is done with the group: the report is written
    exit_now(0 if all(v for k, v in report.items() if isinstance(v, bool)) else 1)


def exit_now(code: int) -> NoReturn:
    """End the process here, with no teardown of the process group, the DDP reducer or the interpreter: each of
    those has hung or aborted a rank in gloo now and then (destroy_process_group about 1 run in 5, a gloo thread
    still winding down at exit with "terminate called without an active exception") after everything was
    checked and written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "trainer":
        trainer_main(*sys.argv[2:5])
    main(sys.argv[1])
