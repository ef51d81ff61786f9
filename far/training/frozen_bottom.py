"""The frozen bottom of a model, computed once per training example: later epochs run only the layers that train.

With the embeddings and the bottom K layers frozen (`far.freeze_layers(model, K)`, `FARConfig(freeze_layers=K)`),
backward already stops at layer K, but forward still runs every layer at every step. Run as at inference (no
dropout), the frozen bottom maps an example to the same states at layer K's input each time the example comes
back. `FrozenBottom` keeps those states per training example; a step run inside `frozen.serving(...)` takes them
from it (layer 0 returns them, layers 1..K-1 pass them on), so after the first epoch a step costs what the top
L - K layers cost.

What changes against training without it: the frozen bottom runs without dropout (as `model.eval()` runs it).
The states are those the model computes at layer K's input in eval mode, to rounding; the layers above run as
they would (dropout included). Rows are kept unpadded, at their attention mask's length, and positions past a
row's end read zeros at layer K: real positions never attend to padding, so every real position's output is
unchanged, while a loss that reads padded positions (extractive QA's start/end softmax spans them) sees other
values there. Batches must be right-padded mappings of tensors whose first dimension is the example.

    >>> frozen = FrozenBottom(model, max_bytes=512 * 2**20)        # K: the model's frozen depth
    >>> with frozen.serving(loss_fn, batch, keys=example_indices):
    ...     loss = loss_fn(model, batch)                            # layers K.. only, once the rows are kept
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from far.architectures import FFNSpec
from far.freezing import depth_parameters, find_layers, frozen_depth

DEFAULT_MAX_BYTES = 1024 * 2**20


class _Reached(Exception):
    """Raised by layer K's stand-in forward during a pre-pass; carries that layer's input."""

    def __init__(self, hidden: Tensor) -> None:
        super().__init__("the frozen bottom's states")
        self.hidden = hidden


def _hidden_of(args: tuple, kwargs: Mapping[str, Any]) -> Tensor:
    """A layer's hidden-states input: its first positional argument, or `hidden_states=`."""
    return args[0] if args else kwargs["hidden_states"]


def _row_lengths(batch: Mapping[str, Any], rows: int, width: int) -> list[int]:
    """Tokens of each row: its attention mask's sum (right padding checked), or the full width without a mask."""
    mask = batch.get("attention_mask")
    if mask is None:
        return [width] * rows
    if mask.shape[1] > 1 and not bool((mask[:, :-1] >= mask[:, 1:]).all()):
        raise ValueError(
            "the frozen-bottom cache keeps each row's first tokens, so batches must be padded on the right; this "
            "batch's attention mask is padded on the left (set tokenizer.padding_side = 'right')"
        )
    return mask.sum(dim=1).tolist()


def _select_rows(batch: Mapping[str, Any], rows: list[int], n: int) -> dict[str, Any]:
    """The batch restricted to `rows`: every tensor whose first dimension is the batch's `n` examples is sliced."""
    index = torch.tensor(rows)
    return {
        key: value.index_select(0, index.to(value.device))
        if isinstance(value, Tensor) and value.dim() and value.shape[0] == n
        else value
        for key, value in batch.items()
    }


@contextmanager
def _forwards(layers: Sequence[nn.Module], forwards: Sequence[Callable]) -> Iterator[None]:
    """Within the block, each layer's `forward` is the one given; its own (or its class's) is put back after."""
    own = [layer.__dict__.get("forward") for layer in layers]
    for layer, forward in zip(layers, forwards, strict=True):
        layer.forward = forward
    try:
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


class FrozenBottom:
    """States at the input of layer K (the lowest that trains), kept per training example.

    Args:
        model: A model whose embeddings and bottom K >= 1 layers are frozen, with at least one layer above them
            that trains (`far.freezing.frozen_depth` finds K).
        spec: FFN layout for architectures that are not built in (it locates the layers).
        max_bytes: Memory the kept states may take; rows seen once it is full go through the bottom layers each
            time they come (still without dropout, and once for both of a MeZO step's passes).

    Raises:
        ValueError: nothing is frozen at the bottom, or nothing above it trains.
    """

    def __init__(self, model: nn.Module, spec: FFNSpec | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        k, n_layers, below_frozen = frozen_depth(model, spec)
        if k == 0 or not below_frozen:
            raise ValueError(
                "the frozen-bottom cache needs the embeddings and at least the bottom layer frozen; freeze them first "
                "(far.freeze_layers(model, K) or FARConfig(freeze_layers=K) with K >= 1)"
            )
        if k == n_layers:
            raise ValueError(
                f"all {n_layers} layers are frozen: no layer above the cached bottom trains; freeze fewer layers"
            )
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        names = find_layers(model, spec)
        self.model, self.k, self.max_bytes = model, k, max_bytes
        self.layers = [model.get_submodule(name) for name in names[: k + 1]]  # the bottom K, then layer K
        frozen = set(depth_parameters(model, names, k))
        self._frozen = [p for name, p in model.named_parameters() if name in frozen]
        self.rows: dict[Hashable, Tensor] = {}
        self.bytes = 0
        self.computed_rows = 0  # rows run through the bottom layers, for reports and tests
        self._extra_outputs: int | None = None  # a layer's outputs beside its hidden states (None: a bare tensor)
        self._last: tuple[Any, list[Tensor]] | None = None  # (batch, its rows' states): MeZO's two passes share it

    def _check_frozen(self) -> None:
        if any(p.requires_grad for p in self._frozen):
            raise RuntimeError(
                f"a weight below layer {self.k} became trainable after the FrozenBottom was built; build a new one "
                "for the new trainable set"
            )

    def _record_outputs(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self._extra_outputs = None if isinstance(output, Tensor) else len(output) - 1

    def _as_output(self, hidden: Tensor) -> Any:
        """`hidden` shaped as the layers return it: a tensor, or a tuple led by it."""
        return hidden if self._extra_outputs is None else (hidden, *([None] * self._extra_outputs))

    @torch.no_grad()
    def _compute(self, loss_fn: Callable[[nn.Module, Any], Tensor], batch: Mapping[str, Any]) -> Tensor:
        """Layer K's input for `batch`: the model run in eval mode through `loss_fn` and stopped at layer K."""
        top, last_frozen = self.layers[self.k], self.layers[self.k - 1]

        def reached(*args: Any, **kwargs: Any) -> Any:
            raise _Reached(_hidden_of(args, kwargs))

        modes = [(module, module.training) for module in self.model.modules()]
        hook = last_frozen.register_forward_hook(self._record_outputs)
        self.model.eval()
        try:
            with _forwards([top], [reached]):
                loss_fn(self.model, batch)
        except _Reached as stop:
            return stop.hidden.detach()
        finally:
            hook.remove()
            for module, mode in modes:
                module.training = mode
        raise RuntimeError(
            f"the loss function returned without running layer {self.k}: the frozen-bottom cache needs a loss that "
            "runs the model's layers in order"
        )

    def _states(self, loss_fn: Callable[[nn.Module, Any], Tensor], batch: Any, keys: Sequence[Hashable]) -> list:
        """Each row's kept states (computing and keeping the missing ones), unpadded: [(n_i, hidden)]."""
        if not isinstance(batch, Mapping):
            raise TypeError(f"the frozen-bottom cache needs batches that are mappings of tensors, got {type(batch)}")
        shaped = batch.get("attention_mask", batch.get("input_ids"))
        if not isinstance(shaped, Tensor) or shaped.dim() != 2:
            raise TypeError(
                "the frozen-bottom cache reads each row's length from the batch's attention_mask or input_ids"
            )
        n, width = shaped.shape
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for a batch of {n} examples: give one key per example")
        lengths = _row_lengths(batch, n, width)
        missing = [i for i, key in enumerate(keys) if key not in self.rows or self.rows[key].shape[0] != lengths[i]]
        fresh: dict[int, Tensor] = {}
        if missing:
            hidden = self._compute(loss_fn, batch if len(missing) == n else _select_rows(batch, missing, n))
            self.computed_rows += len(missing)
            for row, i in enumerate(missing):
                state = hidden[row, : lengths[i]].clone()
                fresh[i] = state
                if keys[i] not in self.rows and self.bytes + state.nbytes <= self.max_bytes:
                    self.rows[keys[i]] = state
                    self.bytes += state.nbytes
        return [fresh[i] if i in fresh else self.rows[key] for i, key in enumerate(keys)]

    @contextmanager
    def serving(
        self, loss_fn: Callable[[nn.Module, Any], Tensor], batch: Any, keys: Sequence[Hashable]
    ) -> Iterator[None]:
        """Within the block, the model's bottom K layers hand back `batch`'s kept states instead of computing.

        Args:
            loss_fn: The loss the block will compute, `loss_fn(model, batch)`: rows not kept yet are computed by
                running it in eval mode up to layer K.
            batch: The batch the block runs the model on (a right-padded mapping of tensors).
            keys: One hashable per example of `batch`, the same every time that example comes (its index in
                the training set).
        """
        self._check_frozen()
        if self._last is None or self._last[0] is not batch:
            self._last = (batch, self._states(loss_fn, batch, keys))
        states = self._last[1]

        def first(*args: Any, **kwargs: Any) -> Any:
            hidden = _hidden_of(args, kwargs)  # (B, T, hidden), the embeddings' output: not needed
            out = torch.zeros(hidden.shape, dtype=states[0].dtype, device=hidden.device)
            for i, state in enumerate(states):
                out[i, : state.shape[0]] = state
            return self._as_output(out)

        def passing(*args: Any, **kwargs: Any) -> Any:
            return self._as_output(_hidden_of(args, kwargs))

        with _forwards(self.layers[: self.k], [first, *[passing] * (self.k - 1)]):
            yield


__all__ = ["DEFAULT_MAX_BYTES", "FrozenBottom"]
