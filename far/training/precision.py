"""Which precision a training run computes in: fp32, or bf16 autocast where the hardware multiplies bf16 natively.

`precision="auto"` picks bf16 only where the hardware multiplies it natively:

- on a CPU whose flags show native bf16 products: `avx512_bf16` (AVX-512 BF16) or `amx_bf16` (AMX tiles).
  There, MiniLM's AdamW step at batch 32 x 64 on one thread took 0.43x of its fp32 step under bf16 autocast with
  FAR (r=0.2, frozen embeddings) and 0.42x with full fine-tuning (AMD EPYC with avx512_bf16, no AMX;
  `python experiments/bench_bf16.py`, experiments/results/bench_bf16/);
- on a CUDA GPU that supports bf16 (`torch.cuda.is_bf16_supported()`).

Everywhere else it picks fp32: on an AVX2-only CPU bf16 products are emulated, and full fine-tuning's bf16 step
took 21x its fp32 step there (docs/results.md, "FAR against the paper"). Weights, gradients and AdamW's state
stay fp32 either way (autocast casts a product's operands, not the parameters), so the learners keep fp32 master
weights; FAR's split layers cast their frozen part once and reuse it (`far.layers.SplitLinear`).

"auto" is asked for, never the default: the same runs in bf16 lost CoLA points (MCC 23.2 +/- 3.0 against fp32's
28.6 +/- 0.7, 3 seeds; docs/results.md, "bf16 on a CPU with native bf16"), so fp32 stays the default of
`far.finetune` and of the `far` command until bf16 is shown to keep the metric.

    >>> choose_precision("auto", torch.device("cpu"), cpu_flags=frozenset({"avx2", "fma"})).name
    'fp32'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from far.hardware import native_bf16

PRECISIONS = ("auto", "fp32", "bf16")
# x86 flags (as /proc/cpuinfo spells them) of instructions that multiply bf16 matrices in hardware.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Precision:
    """The precision a run computes in, and why."""

    name: str  # what runs: "fp32", or "bf16" (forward passes under bf16 autocast)
    requested: str  # "auto", "fp32" or "bf16"
    reason: str  # why `name` was chosen, in words (what the run log and metrics.json record)

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    def to_dict(self) -> dict:
        return asdict(self)


def check_precision(value: object) -> str:
    """`value` if it names a precision; a ValueError naming the choices otherwise."""
    if value not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {value!r}; 'auto' picks bf16 where "
            "the hardware multiplies it natively (a CPU with avx512_bf16 or amx_bf16, a CUDA GPU with bf16) and "
            "fp32 elsewhere"
        )
    return value


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in the text of /proc/cpuinfo (x86's `flags`, Arm's `Features`)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path | None = None) -> frozenset[str] | None:
    """This CPU's flags from /proc/cpuinfo (or `path`); None where there is no such file (not Linux) or it cannot
    be read."""
    try:
        return parse_cpu_flags((CPUINFO if path is None else path).read_text())
    except OSError:
        return None


def native_bf16_cpu(flags: Iterable[str] | None) -> bool:
    """Whether a CPU with these flags multiplies bf16 natively; without flags (not Linux), torch's own check."""
    if flags is None:
        return native_bf16()
    return not NATIVE_BF16_FLAGS.isdisjoint(flags)


def choose_precision(requested: str, device: torch.device, *, cpu_flags: Iterable[str] | None = None) -> Precision:
    """What a run on `device` (where the model's parameters are) computes in, and why, given what was requested.

    "fp32" and "bf16" are taken as they are; "auto" is bf16 on a CPU whose flags show native bf16
    (`NATIVE_BF16_FLAGS`) or a CUDA GPU that supports it, fp32 otherwise. `cpu_flags` (for tests) default to this
    CPU's, from /proc/cpuinfo, else torch's own check of the CPU (`far.hardware.native_bf16`).
    """
    check_precision(requested)
    if requested != "auto":
        return Precision(requested, requested, f"{requested} was asked for")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", requested, "auto: this CUDA GPU supports bf16")
        return Precision("fp32", requested, "auto: this CUDA GPU does not support bf16")
    if device.type != "cpu":
        return Precision("fp32", requested, f"auto: bf16 is not measured on {device.type}")
    flags = read_cpu_flags() if cpu_flags is None else frozenset(cpu_flags)
    if native_bf16_cpu(flags):
        shown = sorted(NATIVE_BF16_FLAGS & set(flags)) if flags is not None else ["torch's CPU check"]
        return Precision("bf16", requested, f"auto: the CPU multiplies bf16 natively ({', '.join(shown)})")
    return Precision(
        "fp32",
        requested,
        "auto: the CPU has no native bf16 (no avx512_bf16 or amx_bf16): bf16 would be emulated, slowly",
    )
