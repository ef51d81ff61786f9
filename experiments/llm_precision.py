"""What bf16 storage does to MeZO, on one of SmolLM2-135M's real FFN weights (blk.0.ffn_up, 885k values).

1. MeZO's usual in-place perturbation (+εz, −2εz, +εz) of a bf16 weight: the fraction of values not
   restored and their drift, against fp32, and against the lean runtime's perturbation on read.
2. An update `w += step * z` of MeZO's size stored in bf16: the fraction of values that do not move
   with round-to-nearest, and how much of the update survives on average, with stochastic rounding.

    python experiments/llm_precision.py        # writes experiments/results/llm_precision/llm_precision.json
"""

from __future__ import annotations

import argparse
import json

import torch
from harness import add_output_argument, results_dir, write_report

from far.llm.compact import CompactWeight, Perturbation, stochastic_round_bf16
from far.llm.gguf_file import _TensorReader, read_config, read_header
from far.models import find_gguf

EPS = 1e-3


def in_place_round_trip(w: torch.Tensor, z: torch.Tensor) -> dict:
    """+εz, −2εz, +εz in w's own dtype: what MeZO's restore leaves behind."""
    x = w.clone()
    x.add_(z.to(w.dtype), alpha=EPS)
    x.add_(z.to(w.dtype), alpha=-2 * EPS)
    x.add_(z.to(w.dtype), alpha=EPS)
    diff = (x.float() - w.float()).flatten()
    return {
        "changed_fraction": float((diff != 0).float().mean()),
        "drift_rms_over_eps": float(diff.pow(2).mean().sqrt() / EPS),
    }


def on_read_round_trip(w: torch.Tensor) -> dict:
    perturbation = Perturbation()
    weight = CompactWeight(w, w.dtype, True, perturbation)
    before = weight.stored.detach().clone()
    for scale in (EPS, -EPS):
        perturbation.set(seed=1, scale=scale)
        weight.value()
    perturbation.clear()
    return {"changed_fraction": float((weight.stored != before).float().mean()), "drift_rms_over_eps": 0.0}


def update_survival(w: torch.Tensor, z: torch.Tensor, step: float) -> dict:
    exact = w.float() + step * z  # the intended update, in fp32
    nearest = (w.float() + step * z).to(torch.bfloat16)
    stochastic = stochastic_round_bf16(w.float() + step * z, torch.Generator().manual_seed(0))
    moved = lambda x: float((x != w).float().mean())  # noqa: E731
    kept = lambda x: float(((x.float() - w.float()) * z).sum() / ((exact - w.float()) * z).sum())  # noqa: E731
    return {
        "step": step,
        "round_to_nearest": {"values_moved": moved(nearest), "update_kept": kept(nearest)},
        "stochastic": {"values_moved": moved(stochastic), "update_kept": kept(stochastic)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_argument(parser, results_dir(__file__) / "llm_precision.json", "the JSON report")
    args = parser.parse_args(argv)
    path = find_gguf("smollm2-135m")
    header = read_header(path)
    w32 = _TensorReader(path, header, read_config(header))("model.layers.0.mlp.up_proj.weight")
    w16 = w32.to(torch.bfloat16)
    z = torch.randn(w32.shape, generator=torch.Generator().manual_seed(0))
    report = {
        "tensor": "blk.0.ffn_up.weight (model.layers.0.mlp.up_proj), SmolLM2-135M Q4_1 GGUF, dequantised",
        "eps": EPS,
        "in_place_perturb_and_restore": {
            "fp32": in_place_round_trip(w32, z),
            "bf16": in_place_round_trip(w16, z),
            "bf16, perturbed on read (far.llm.compact)": on_read_round_trip(w16),
        },
        # lr * projected gradient: MeZO's steps are ~1e-4 .. 1e-6 per unit of z.
        "bf16_updates": [update_survival(w16, z, step) for step in (1e-3, 1e-4, 1e-5, 1e-6)],
    }
    print(json.dumps(report, indent=2))
    write_report(args.output, report)


if __name__ == "__main__":
    main()
