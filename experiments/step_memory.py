"""Two memory measures of one training step, taken inside the process that runs it.

- *Bytes kept for backward*: every tensor that autograd saves during the forward pass, counted once
  per storage, leaving out the model's own parameters (a layer that saves its weight keeps nothing
  new alive). A cast copy of a weight (autocast's bf16 weights, FAR's bf16 cache) does count.
- *Peak live memory of a step*: the largest total of tensor memory allocated since the step began
  and not yet freed (the CPU allocator's events, through the profiler); what was alive before the
  step (weights, optimizer state after the first step) is the baseline, not counted.

Whole-process peak RSS (fresh processes, /usr/bin/time -v) is measured elsewhere; these two say where
FAR's savings come from.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def saved_for_backward_bytes(model: nn.Module, forward: Callable[[], torch.Tensor]) -> int:
    """Bytes that autograd keeps between `forward()` (which returns the loss) and its backward pass.

    The loss is backpropagated afterwards so that the graph is freed as in a real step.
    """
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and tensor.device.type != "meta":
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward()
    loss.backward()
    return sum(storages.values())


def peak_live_bytes(step: Callable[[], None]) -> int:
    """Peak of tensor bytes allocated and still alive during `step()`, above what was alive before it."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak
