"""First-order gradients of a lean model's trainable weights, for AdamW on the same weights MeZO trains.

A `CompactLinear` hands its weight gradient to `grad_sink` and keeps none; `LearnerGradients` adds each
trainable block's slice into its `.grad`, so memory grows with what trains, not with the model. Within
`stepping(step)` each block is stepped as soon as its gradient is complete and the gradient dropped: one
block's gradient at a time (instead of 64 MiB for SmolLM2's 16.8M trained values), bit for bit the same
update, since no later part of backward reads a layer's weights.

    >>> gradients = LearnerGradients(model)
    >>> optimizer = FusedAdamW(gradients.parameters(), lr=1e-4)
    >>> with gradients, gradients.stepping(optimizer.step_one), model.input_gradients(), torch.enable_grad():
    ...     model.next_token_loss(ids, start=cached, start_layer=20).backward()
    >>> optimizer.step(); gradients.zero()  # what autograd filled: the norm gains
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import TracebackType

import torch
from torch import Tensor

from far.llm.compact import CompactLinear, CompactWeight
from far.llm.lean_model import LeanCausalLM


class LearnerGradients:
    """Collects the gradients of `model.trainable_weights()` (fp32: AdamW's updates are below bf16's
    resolution) into each weight's `stored.grad` while active.
    """

    def __init__(self, model: LeanCausalLM) -> None:
        weights = model.trainable_weights()
        if not weights:
            raise ValueError("the model has no trainable weight; mark some with far.llm.lean_far.set_trainable")
        wrong = [w for w in weights if w.stored.dtype != torch.float32]
        if wrong:
            raise ValueError(
                f"first-order training needs its {len(wrong)} trainable weights in float32, not "
                f"{wrong[0].stored.dtype}: store them with set_trainable(..., dtype=torch.float32)"
            )
        self.model, self.weights = model, weights
        self.linears = [
            m for m in model.modules() if isinstance(m, CompactLinear) and any(p.trainable for p in m.parts)
        ]
        in_linear = {id(p) for m in self.linears for p in m.parts}
        # Norm gains are read by plain torch ops, so autograd gives their gradient directly.
        self.gains = [w for w in weights if id(w) not in in_linear]
        self._step: Callable[[Tensor], None] | None = None

    def parameters(self) -> list[Tensor]:
        """The trainable tensors (each weight's storage), for an optimizer."""
        return [w.stored for w in self.weights]

    @contextlib.contextmanager
    def stepping(self, step: Callable[[Tensor], None]) -> Iterator[None]:
        """Within the block, each learner gradient goes to `step(tensor)` once complete, then is dropped
        (a step's last backward only; the norm gains' gradients stay for `step()`).
        """
        self._step = step
        try:
            yield
        finally:
            self._step = None

    def zero(self) -> None:
        for w in self.weights:
            w.stored.grad = None

    def _sink(self, linear: CompactLinear) -> Callable[[Tensor], None]:
        def add(grad: Tensor) -> None:  # grad: (out, in) of the whole projection, blocks along node_dim
            offset = 0
            for part in linear.parts:
                size = part.stored.shape[linear.node_dim]
                if part.trainable:
                    block = grad.narrow(linear.node_dim, offset, size)
                    _accumulate(part, block)
                    if self._step is not None:
                        self._step(part.stored)
                        part.stored.grad = None
                offset += size

        return add

    def __enter__(self) -> LearnerGradients:
        for linear in self.linears:
            if linear.grad_sink is not None:
                raise RuntimeError("a layer already has a gradient sink (gradient priming running?)")
        for linear in self.linears:
            linear.grad_sink = self._sink(linear)
        for gain in self.gains:
            gain.stored.requires_grad_(True)
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        for linear in self.linears:
            linear.grad_sink = None
        for gain in self.gains:
            gain.stored.requires_grad_(False)


def _accumulate(weight: CompactWeight, block: Tensor) -> None:
    if weight.stored.grad is None:
        weight.stored.grad = block.contiguous().clone()
    else:
        weight.stored.grad.add_(block)
