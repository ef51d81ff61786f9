"""Side-by-side comparisons for the demo and for scripts: a majority-class baseline, a run's CPU seconds,
the file a plainly frozen model ships, paired step times.

What a user waits for is the whole run, priming and evaluation included: `cpu_timed` measures a call
in process CPU seconds, which stay comparable across runs on a shared machine where wall time does not
(another job's load stretches wall time, not this process's CPU time).

Step times of two configurations are only comparable when measured in the same process at the same
time: `paired_step_times` interleaves one training step of each model per round, on the same batch,
rotating their order, so that slow drift of the machine hits both alike.

    >>> times = paired_step_times({"full": full_model, "far": far_model}, batch, rounds=10)
    >>> statistics.median(t / f for t, f in zip(times["far"], times["full"]))
    0.87
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import save_file
from torch import nn

from far.storage.atomic import atomic_file
from far.training.optim import build_optimizer


def majority_baseline(labels: Sequence[int], metric) -> tuple[int, dict[str, float]]:
    """The most frequent label (class id) and `metric` (anything with `compute(predictions=, references=)`) of
    predicting it for every example."""
    if not labels:
        raise ValueError("majority_baseline needs at least one label")
    majority = Counter(int(y) for y in labels).most_common(1)[0][0]
    return majority, metric.compute(predictions=[majority] * len(labels), references=list(labels))


T = TypeVar("T")


def cpu_timed(run: Callable[[], T]) -> tuple[T, float]:
    """`run()`'s result and the process CPU seconds it took (every thread's, user and system).

    Example:
        >>> result, seconds = cpu_timed(lambda: far.finetune(model, data, None))
    """
    started = time.process_time()
    result = run()
    return result, time.process_time() - started


def save_trained_tensors(model: nn.Module, path: str | Path) -> Path:
    """Write the tensors `model` trains (`requires_grad`), and only those, to a safetensors file, atomically.

    What a model fine-tuned with a plainly frozen bottom ships beside its stock base: everything else
    is the base's. Tied tensors are written once (`named_parameters` yields each tensor once).
    """
    trained = {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    if not trained:
        raise ValueError("the model trains no tensor (every requires_grad is False): there is nothing to write")
    path = Path(path)
    with atomic_file(path) as tmp:  # whole or not at all; a full disk is named (DiskFull), not a safetensors error
        save_file(trained, str(tmp))
    return path


def paired_step_times(
    models: Mapping[str, nn.Module],
    batch: Mapping[str, torch.Tensor],
    *,
    rounds: int = 10,
    warmup: int = 2,
    lr: float = 1e-4,
) -> dict[str, list[float]]:
    """Seconds of one AdamW training step (forward, backward, update) of each model, round by round.

    Each model is copied first (the models given are left as they are) and gets the optimizer
    `far.finetune` builds: fused AdamW over its trainable tensors only. Rounds are aligned across names (for
    paired ratios): {name: [seconds per timed round]}.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be at least 1 and warmup at least 0, got {rounds} and {warmup}")
    work = {name: copy.deepcopy(model).train() for name, model in models.items()}
    optimizers = {
        name: build_optimizer("adamw", m, lr=lr, weight_decay=0.0, mezo_eps=1e-3, mezo_directions=1, seed=0)
        for name, m in work.items()
    }
    names = list(work)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            model, optimizer = work[name], optimizers[name]
            started = time.perf_counter()
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if r >= warmup:
                times[name].append(time.perf_counter() - started)
    return times
