"""`far generate`: what a GGUF causal LM writes after a prompt, stock or with a user's learners file.

far generate --model smollm2-135m --prompt "The best thing about mornings is"
far generate --model smollm2-135m --learners alice.safetensors --prompt "Dear Sam," --max-new-tokens 60
far generate --model smollm2-135m --learners alice.safetensors bob.safetensors --prompt "Dear Sam," --temperature 0.8

With several learners files, the model loads once and each user's file is swapped in place; each user's
text follows a line `== <file> ==`. A file that is refused is reported and skipped (exit code 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from far.llm.generate import GenerationConfig, generate
from far.llm.lean_learners import load_learners, values_dtype
from far.models import load_lean_lm


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="write text with a GGUF causal LM, stock or with users' learners files",
        description="Continue a prompt with a GGUF causal LM (an alias such as smollm2-135m, or a .gguf file), "
        "greedy by default, or sampled with --temperature; with --learners, as each user's fine-tune writes it.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, metavar="NAME", help="smollm2-135m, gemma3-270m, or a .gguf file")
    parser.add_argument(
        "--learners", nargs="+", default=None, metavar="FILE", help="users' learners files (far.save_trained), in turn"
    )
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="(default: 32)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    parser.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K likeliest tokens")
    parser.add_argument("--top-p", type=float, default=None, metavar="P", help="sample within probability mass P")
    parser.add_argument("--seed", type=int, default=0, help="of the sampling (default: 0)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the request fails before the weights load.
    config = GenerationConfig(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    files = [Path(f) for f in args.learners or []]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"--learners: no such file {missing[0]!r}")
    # A first-order run's learners are float32: the base is then loaded in float32, so that they apply exactly.
    dtypes = {values_dtype(f) for f in files}
    model, tokenizer = load_lean_lm(args.model, dtype=torch.float32 if torch.float32 in dtypes else torch.bfloat16)
    prompt = tokenizer(args.prompt)["input_ids"]
    if not prompt:
        raise ValueError("--prompt is empty; give some text to continue")
    if not files:
        sys.stdout.write(tokenizer.decode(generate(model, prompt, config, tokenizer.eos_token_id)) + "\n")
        return 0
    failed = 0
    for path in files:
        started = time.perf_counter()
        try:
            load_learners(model, path)
        except ValueError as error:
            print(f"far generate: skipped {path}: {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"far generate: {path} applied in {(time.perf_counter() - started) * 1e3:.0f} ms", file=sys.stderr)
        written = tokenizer.decode(generate(model, prompt, config, tokenizer.eos_token_id))
        sys.stdout.write(f"== {path} ==\n{written}\n" if len(files) > 1 else written + "\n")
        sys.stdout.flush()
    if failed == len(files):
        raise ValueError(f"no user's text was written: all {len(files)} learners file(s) were refused (above)")
    return 1 if failed else 0
