"""The frozen bottom of a lean model, computed once per prompt: MeZO then runs only the layers it trains.

When every trainable weight lies at or above layer K, layers 0..K-1 map a prompt to the same states at
every step and in both of MeZO's passes: a step costs 2 (L - K) / L of the forward passes. States live
in memory up to `max_bytes`, or in a scratch file (`far.llm.state_file`). Rows are keyed by their tokens:
right-padded, a causal row's states depend on its own tokens alone.

    >>> cache = PrefixCache(model)                 # K = model.lowest_trainable_layer()
    >>> loss_fn = cache.loss_fn(label_ids)         # a drop-in for far.data.prompts.prompt_loss_fn
    >>> optimizer.step(lambda: loss_fn(model, batch))
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from far.llm.lean_model import LeanCausalLM
from far.llm.state_file import StateFile

DEFAULT_MAX_BYTES = 256 * 2**20


class PrefixCache:
    """Hidden states after a lean model's frozen bottom layers, kept per prompt.

    Args:
        n_layers: Bottom layers covered (default: all frozen ones, `model.lowest_trainable_layer()`).
        max_bytes: Memory the kept states may take; rows seen once it is full are computed each time.
        store: Keep every state in this file instead (`max_bytes` does not apply).
    """

    def __init__(
        self,
        model: LeanCausalLM,
        n_layers: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        store: StateFile | None = None,
    ) -> None:
        lowest = model.lowest_trainable_layer()
        n_layers = lowest if n_layers is None else n_layers
        if not 0 <= n_layers <= len(model.layers):
            raise ValueError(f"n_layers must lie in [0, {len(model.layers)}], got {n_layers}")
        if n_layers > lowest:
            raise ValueError(
                f"layer {lowest} holds a trainable weight, so a cache of the bottom {n_layers} layers would go stale; "
                f"give n_layers <= {lowest} (or leave it out)"
            )
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.model, self.n_layers, self.max_bytes = model, n_layers, max_bytes
        self.rows: dict[bytes, Tensor] = {}
        self.store = store
        self.bytes = 0  # kept in memory
        self.computed_rows = 0  # rows run through the bottom layers, for reports and tests

    def _check_frozen(self) -> None:
        if self.model.lowest_trainable_layer() < self.n_layers:
            raise RuntimeError(
                f"a weight below layer {self.n_layers} became trainable after the PrefixCache was built; "
                "build a new cache for the new trainable set"
            )

    @torch.no_grad()
    def hidden(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The input of layer `n_layers` for a right-padded batch: (B, T, hidden), zeros past each row's end."""
        self._check_frozen()
        lengths = attention_mask.sum(dim=1).tolist()
        keys = [input_ids[i, :n].to(torch.int64).numpy().tobytes() for i, n in enumerate(lengths)]
        missing = [i for i, key in enumerate(keys) if not self._has(key)]
        fresh: dict[int, Tensor] = {}
        if missing:
            longest = max(lengths[i] for i in missing)
            h = self.model.run_layers(self.model.embed(input_ids[missing, :longest]), 0, self.n_layers)
            self.computed_rows += len(missing)
            for row, i in enumerate(missing):
                state = h[row, : lengths[i]].clone()
                fresh[i] = state
                self._keep(keys[i], state)
        out = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.model.config.hidden_size)
        for i, key in enumerate(keys):
            out[i, : lengths[i]] = fresh[i] if i in fresh else self._kept(key)
        return out

    def prefill(self, input_ids: Tensor) -> None:
        """Compute and keep the states of packed rows (N, T), one row at a time (as a step reads them)."""
        for row in input_ids.split(1):
            self.hidden(row, torch.ones_like(row))

    def _has(self, key: bytes) -> bool:
        return key in self.store if self.store is not None else key in self.rows

    def _kept(self, key: bytes) -> Tensor:
        return self.store.get(key) if self.store is not None else self.rows[key]

    def _keep(self, key: bytes, state: Tensor) -> None:
        if self.store is not None:
            self.store.put(key, state)
        elif self.bytes + state.nbytes <= self.max_bytes and key not in self.rows:
            self.rows[key] = state
            self.bytes += state.nbytes

    def label_logits(self, input_ids: Tensor, attention_mask: Tensor, label_ids: Tensor, start: Tensor | None = None):
        """`model.label_logits`, running layers `n_layers`.. on the cached states (or on `start`, if given)."""
        h = self.hidden(input_ids, attention_mask) if start is None else start
        top = self.model.run_layers(h, self.n_layers)
        return self.model.answer_logits(top, attention_mask, label_ids)

    def loss_fn(self, label_ids: Tensor) -> Callable[[LeanCausalLM, dict[str, Tensor]], Tensor]:
        """`far.data.prompts.prompt_loss_fn(label_ids)` on the cached states: the bottom's output is reused while
        the same batch object comes back, so MeZO's two passes share it even when the cache is full.
        """
        last: dict[str, object] = {"batch": None, "h": None}

        def loss_fn(model: LeanCausalLM, batch: dict[str, Tensor]) -> Tensor:
            if model is not self.model:
                raise ValueError("this loss function belongs to the PrefixCache of another model")
            if last["batch"] is not batch:
                last["batch"], last["h"] = batch, self.hidden(batch["input_ids"], batch["attention_mask"])
            logits = self.label_logits(batch["input_ids"], batch["attention_mask"], label_ids, start=last["h"])
            return F.cross_entropy(logits.float(), batch["labels"])

        return loss_fn
