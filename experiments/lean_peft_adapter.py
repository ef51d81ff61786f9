"""A GGUF causal LM's learners file as a PEFT adapter, on the real model: PEFT on far's transformers base against the
lean runtime with the file, on one fixed prompt, fp32 compute on both sides.

Writes the base (`far.methods.lean_hf.save_hf_base`) and the adapter (`save_lean_peft_adapter`), timed, then
compares the logits over the whole vocabulary at every position of the prompt: PEFT on the base against
`far.load_learners` on the lean model (the target: 1e-5), the base alone against the stock lean model (how far the
two implementations of the same weights are apart), and PEFT against its own `merge_and_unload` (the LoRA path's
rounding: x W^T + (x A^T) B^T is x W'^T summed in another order). Then the same in float64: PEFT's unmerged
adapter on a float64 base against the user's model (`far.methods.peft_lean.user_hf_model`, the weights
`far.load_learners` gives, merged) in float64, which says whether the adapter represents the user exactly; and each
fp32 path (far's lean runtime, PEFT unmerged, PEFT merged) against that float64 reference, which says how far each
one's own rounding takes it from the exact logits. It also loads the
GGUF file with transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`) and says whether that is the
same base (its fp32 dequantisation against the lean model's storage).

    far train --model smollm2-135m --train-file docs/ --max-steps 4 --output-dir /tmp/notes
    OMP_NUM_THREADS=1 python experiments/lean_peft_adapter.py --learners /tmp/notes/learners.safetensors
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import peft
import torch
from harness import add_output_argument, command_line, machine, results_dir, write_report
from transformers import AutoModelForCausalLM

import far
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import values_dtype
from far.llm.tokenizer import load_gguf_tokenizer
from far.methods.lean_hf import hf_state_dict, save_hf_base
from far.methods.peft_lean import save_lean_peft_adapter, user_hf_model
from far.models import find_gguf

PROMPT = "FAR freezes most of a network's feed-forward nodes and trains the rest, so a user's file is small."


def folder_bytes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@torch.no_grad()
def transformers_gguf_loader(gguf: Path, ours: dict[str, torch.Tensor], ids: torch.Tensor, stock: torch.Tensor) -> dict:
    """transformers' own GGUF loader (the fp32 dequantisation) against far's base and the lean model in fp32."""
    try:
        theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    except Exception as error:  # an architecture or quantisation that transformers' loader does not take
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    state = theirs.state_dict()
    weights = {key: max_diff(state[key], value) for key, value in ours.items()}
    weights32 = {key: max_diff(state[key], v) for key, v in hf_state_dict(load_lean_model(gguf, torch.float32)).items()}
    return {
        "logits_vs_lean_stock": max_diff(theirs(ids).logits, stock),
        "weights_equal_to_far_base": sum(v == 0 for v in weights.values()),
        "weights_differing_from_far_base": sum(v > 0 for v in weights.values()),
        "largest_weight_diff_from_far_base": max(weights.values()),
        "weights_equal_to_lean_fp32_storage": sum(v == 0 for v in weights32.values()),
        "largest_weight_diff_from_lean_fp32_storage": max(weights32.values()),
    }


@torch.no_grad()
def float64_reference(model, learners: Path, adapter: Path, base: Path, ids: torch.Tensor, fp32: dict) -> dict:
    """The user's logits in float64 two ways (PEFT unmerged, far's merged weights), and each fp32 path against them."""
    exact = user_hf_model(model, learners).double()(ids).logits  # (1, T, vocab)
    unmerged = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float64), adapter
    ).eval()
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in unmerged.parameters()})
    peft64 = unmerged(ids).logits
    return {
        "parameter_dtypes": dtypes,
        "peft_unmerged_fp64_vs_far_user_fp64": max_diff_64(peft64, exact),
        **{f"{name}_vs_far_user_fp64": max_diff_64(logits, exact) for name, logits in fp32.items()},
    }


def max_diff_64(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@torch.no_grad()
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=Path, required=True, help="a learners file of --model (far train's)")
    parser.add_argument("--model", default="smollm2-135m", help="the GGUF alias the file was trained from")
    add_output_argument(parser, results_dir(__file__) / "report.json", "the JSON report")
    args = parser.parse_args(argv)
    gguf = find_gguf(args.model)
    dtype = values_dtype(args.learners)
    ids = torch.tensor([load_gguf_tokenizer(gguf)(PROMPT)["input_ids"]])  # (1, T)
    work = Path(tempfile.mkdtemp(prefix="lean-peft-"))
    model = load_lean_model(gguf, dtype)
    started = time.perf_counter()
    save_hf_base(model, work / "base")
    base_seconds = time.perf_counter() - started
    started = time.perf_counter()
    save_lean_peft_adapter(model, args.learners, work / "adapter", base_dir=work / "base")
    adapter_seconds = time.perf_counter() - started
    config = peft.PeftConfig.from_pretrained(work / "adapter")
    stock_logits = model.logits(ids)  # (1, T, vocab), fp32 compute
    lean = far.load_learners(model, args.learners).logits(ids)
    far.unload_learners(model)

    started = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(work / "base", dtype=torch.float32).eval()
    with_adapter = peft.PeftModel.from_pretrained(base, work / "adapter").eval()
    load_seconds = time.perf_counter() - started
    got = with_adapter(ids).logits
    with with_adapter.disable_adapter():
        base_logits = with_adapter(ids).logits
    merged = with_adapter.merge_and_unload()(ids).logits

    del base, with_adapter
    fp32 = {"far_lean_fp32": lean, "peft_unmerged_fp32": got, "peft_merged_fp32": merged}
    float64 = float64_reference(model, args.learners, work / "adapter", work / "base", ids, fp32)
    loader = transformers_gguf_loader(gguf, hf_state_dict(model), ids, stock_logits)

    adapter_files = folder_bytes(work / "adapter")
    report = {
        "command": command_line(__file__, argv),
        "machine": machine(),
        "model": args.model,
        "gguf_file": gguf.name,
        "learners_file": str(args.learners),
        "learners_file_bytes": args.learners.stat().st_size,
        "storage_dtype": str(dtype).removeprefix("torch."),
        "compute_dtype": "float32 (both sides)",
        "prompt_tokens": ids.shape[1],
        "max_abs_logit": lean.abs().max().item(),
        "max_abs_diff": {
            "peft_on_far_base_vs_lean_with_learners": max_diff(got, lean),
            "far_base_vs_lean_stock": max_diff(base_logits, stock_logits),
            "peft_vs_its_merge_and_unload": max_diff(got, merged),
            "merge_and_unload_vs_lean_with_learners": max_diff(merged, lean),
            "users_change_lean_with_vs_without_learners": max_diff(lean, stock_logits),
        },
        "float64": float64,
        "transformers_gguf_loader": loader,
        "adapter": {
            "files_bytes": adapter_files,
            "total_bytes": sum(adapter_files.values()),
            "lora_projections": len(config.rank_pattern),
            "ranks": sorted(set(config.rank_pattern.values())),
            "modules_to_save": len(config.modules_to_save or []),
        },
        "base_bytes": sum(folder_bytes(work / "base").values()),
        "seconds": {
            "write_base": round(base_seconds, 2),
            "write_adapter": round(adapter_seconds, 2),
            "load_base_and_adapter": round(load_seconds, 2),
        },
    }
    write_report(args.output, report)
    return report


if __name__ == "__main__":
    main()
