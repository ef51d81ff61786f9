"""`far export`: turn a FAR checkpoint into a plain Hugging Face folder, a learners-only file, or ExecuTorch programs.

far export --checkpoint ckpt --merge plain-model/
far export --checkpoint ckpt --learners-only user-42.safetensors
far export --checkpoint ckpt --executorch OUT/ --batch-size 32 --max-length 64 --xnnpack matmul
far export --checkpoint base/ --learners user-42.safetensors --executorch OUT/
far export --checkpoint minilm --learners user-42.safetensors --peft user-42-lora/
far export --model smollm2-135m --learners user-42.safetensors --peft user-42-lora/ --base-out smollm2-hf/
far export --model smollm2-135m --executorch OUT/ --train-file notes/
far export --from-executorch OUT/ --state user.safetensors --learners-only notes-learners.safetensors
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from pathlib import Path

import far
import far.device as device
import far.recipes as recipes  # lazy: the predictor (and datasets) load only for --learners
from far.cli.export_lm import (
    Default,
    DefaultText,
    add_generate_arguments,
    add_state_arguments,
    check_lm_args,
    check_state_args,
    export_lm,
    export_lm_peft,
    export_state_learners,
    fill_defaults,
)
from far.device.lowering import INSTALL_HINT, XNNPACK_LEVELS, quietly
from far.device.plan import EXPORTABLE
from far.methods.peft_adapter import save_peft_adapter
from far.models import MODEL_ALIASES, is_causal_lm, load_trained_model
from far.recipes.outputs import existing_run
from far.saving.learners_file import save_learners
from far.saving.pretrained import CONFIG_NAME, from_pretrained, has_far_layout, weight_files, write_pretrained
from far.storage import lock
from far.storage.atomic import atomic_dir
from far.surgery.reconfigure import restore
from far.surgery.state import is_reconfigured
from far.training.options import LEARNING_RATES

# Tokenizer files a Hugging Face folder may hold; copied as they are by --merge.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="merge a FAR checkpoint into a plain model, extract its learners, or export ExecuTorch programs",
        description="Export a FAR checkpoint (a folder written by far.save_pretrained) as a plain Hugging Face "
        "folder that any transformers user loads with AutoModel*, as a learners-only safetensors file "
        "that far.load_learners applies to the base model, or as ExecuTorch programs that train its learners "
        "on a device (docs/device.md).",
    )
    parser.add_argument("--checkpoint", type=Path, metavar="DIR", help="FAR checkpoint folder (or --model)")
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="with --executorch: a GGUF causal LM (smollm2-135m, gemma3-270m or a .gguf file), exported with FAR's "
        "layout for text (docs/device.md); with --peft: the GGUF base of --learners FILE (docs/llm.md)",
    )
    parser.add_argument(
        "--train-file",
        type=Path,
        metavar="PATH",
        help="with --model: texts (a folder of .txt/.md/.jsonl, as far train --train-file) whose first chunks "
        "choose the learners by gradient priming (default: by weight magnitude, no texts)",
    )
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--merge", type=Path, metavar="OUT", help="write a plain Hugging Face folder (with tokenizer)")
    out.add_argument(
        "--learners-only",
        type=Path,
        metavar="OUT.safetensors",
        help="write only what FAR training changed (--checkpoint's, or --from-executorch's state)",
    )
    out.add_argument(
        "--executorch",
        type=Path,
        metavar="OUT",
        help="write ExecuTorch programs that train the learners (train.pte, bottom.pte, manifest, state)",
    )
    out.add_argument(
        "--peft",
        type=Path,
        metavar="OUT",
        help="write --learners FILE as a PEFT LoRA adapter folder for the stock model --checkpoint (a folder or an "
        "alias), or for the transformers form of the GGUF causal LM --model: each FFN projection's learners as LoRA "
        "factors of rank = their count, exact (docs/cli.md)",
    )
    parser.add_argument(
        "--learners",
        type=Path,
        metavar="FILE",
        help="with --executorch or --peft: a learners file for --checkpoint, a stock model folder (or, with "
        "--peft, an alias such as minilm); with --model: a causal LM's learners file (far train, far export "
        "--from-executorch) or a text run's folder, whose training --executorch continues",
    )
    parser.add_argument(
        "--base-out",
        type=Path,
        metavar="DIR",
        help="with --model and --peft: also write the base the adapter applies to, the GGUF model's weights as the "
        "lean runtime holds them as a transformers folder (config.json, model.safetensors); a folder that already "
        "holds this base is used as it is (once per base)",
    )
    add_state_arguments(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace an OUT folder that holds files")
    group = parser.add_argument_group("ExecuTorch (--executorch)")
    _add_executorch_arguments(group)
    add_generate_arguments(group)
    parser.set_defaults(func=run)


def _add_executorch_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--batch-size",
        type=int,
        default=Default(32),
        help="examples per optimizer step (default 32; --model: 4 chunks, as far train)",
    )
    group.add_argument(
        "--micro-batch-size",
        type=int,
        help="the programs' fixed batch, dividing --batch-size: the same steps in less memory (default: "
        f"{DEFAULT_MICRO_BATCH} where it divides --batch-size, else --batch-size; --model: 1)",
    )
    group.add_argument(
        "--max-length",
        type=int,
        default=Default(64),
        help="the programs' tokens per example (default 64; --model: 256, as far train)",
    )
    group.add_argument(
        "--optimizer", choices=("adamw", "sgd"), default="adamw", help="the device's optimizer (default adamw)"
    )
    group.add_argument(
        "--lr",
        type=float,
        help="learning rate (default 1e-4 for adamw, as far train; 0.01 for sgd; --model: 3e-4 for adamw, as far "
        "train on texts)",
    )
    group.add_argument("--momentum", type=float, default=0.9, help="SGD's momentum (default 0.9)")
    group.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default 0)")
    group.add_argument(
        "--max-grad-norm",
        type=float,
        default=1.0,
        help="clip the gradients' total norm (default 1.0, as far train; 0: off)",
    )
    group.add_argument(
        "--schedule",
        choices=("linear", "constant"),
        default=DefaultText("linear"),
        help="lr schedule: linear decay to zero over the device run (default, as far train) or constant (--model: "
        "constant only, as far train on texts)",
    )
    group.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps of the linear schedule")
    group.add_argument(
        "--xnnpack",
        choices=XNNPACK_LEVELS,
        default=DefaultText("none"),
        help="delegate the training program's operators to XNNPACK: none (default: seconds to export, the least "
        "memory; far_train runs its products on XNNPACK's kernels op by op; --model: none only), matmul (the "
        "matrix products delegated: about the same step in a third more memory, a minute to export MiniLM), all "
        "(the fastest step, the most memory; ten minutes or more to export)",
    )


# The programs' batch by default: a batch of 32 x 64 tokens in one pass plans about 770 MB of activations in
# far_train, more than the Python run that made the model; four passes of 8 take the same step in a third of it
# (docs/device.md, "Memory").
DEFAULT_MICRO_BATCH = 8
# What each XNNPACK level costs to export and buys in steps (docs/device.md, "Speed and size").
_LOWERING = {
    "none": "seconds to export, the least memory (--xnnpack all: a faster step in more memory, ten minutes or "
    "more to export)",
    "matmul": "a minute to export MiniLM, about none's step in more memory",
    "all": "ten minutes or more to export MiniLM, the fastest step, the most memory (none: seconds)",
}


def _micro_batch(args: argparse.Namespace) -> int:
    if args.micro_batch_size is not None:
        return args.micro_batch_size
    return DEFAULT_MICRO_BATCH if args.batch_size % DEFAULT_MICRO_BATCH == 0 else args.batch_size


def _size(n_bytes: int) -> str:
    return f"{n_bytes:,} bytes ({n_bytes / 2**20:.2f} MiB)"


def _no_model_folder(checkpoint: Path, executorch: bool) -> str:
    """Why `checkpoint` (a folder without config.json) cannot be exported, and what can."""
    kinds = ", ".join(repr(kind) for kind in EXPORTABLE)
    supported = (
        f"--executorch exports FAR-reconfigured sequence classifiers of {kinds} (e.g. MiniLM's run: "
        "--checkpoint runs/<task>-minilm-far/model)"
        if executorch
        else "far export reads a model folder with a config.json, as far train/glue/squad save an encoder's (e.g. "
        "runs/<task>-minilm-far/model) or far.save_pretrained writes"
    )
    held = existing_run(checkpoint) or {}
    if is_causal_lm(str(held.get("model", ""))) or (checkpoint / "trained.safetensors").is_file():
        return (
            f"--checkpoint {str(checkpoint)!r} is a GGUF causal LM's run ({held.get('model', 'a .gguf model')}), which "
            f"far export does not export: {supported}. A causal LM's run keeps what it trained in its own file, which "
            "far generate --learners FILE (or far.models.load_lean_lm(model, trained=FILE)) applies to the GGUF model. "
            f"To train the causal LM on a device, export it with --model: far export --executorch OUT --model "
            f"{held.get('model', 'MODEL.gguf')} --learners {checkpoint} (its training goes on from this run's "
            f"learners); as a PEFT adapter: far export --model {held.get('model', 'MODEL.gguf')} --learners "
            f"{checkpoint / 'learners.safetensors'} --peft OUT --base-out BASE"
        )
    return f"--checkpoint {str(checkpoint)!r} is not a model folder (no {CONFIG_NAME} in it): {supported}"


def _check_args(args: argparse.Namespace) -> None:
    if (args.checkpoint is None) == (args.model is None):
        raise ValueError(
            "name what to export: --checkpoint DIR (an encoder's FAR checkpoint) or, with --executorch, --model NAME "
            "(a GGUF causal LM; with --peft too); one of them"
        )
    if args.train_file is not None and args.model is None:
        raise ValueError("--train-file chooses a causal LM's learners from your texts: use it with --model NAME")
    if args.generate is not None and (args.model is None or args.executorch is None):
        raise ValueError(
            "--generate adds a causal LM's decoding program to its export: use it with --model NAME --executorch OUT"
        )
    if args.model is not None:
        return check_lm_args(args)
    if args.base_out is not None:
        raise ValueError("--base-out writes a GGUF causal LM's transformers base: use it with --model NAME and --peft")
    checkpoint = args.checkpoint
    if args.peft is not None:
        if args.learners is None:
            raise ValueError("--peft writes a learners file as an adapter: add --learners FILE (far.save_learners)")
        if not args.learners.is_file():
            raise ValueError(f"--learners {str(args.learners)!r} is not a file")
        if args.peft.exists() and not args.peft.is_dir():
            raise ValueError(f"--peft {str(args.peft)!r} is a file; name a folder to write the adapter into")
        if str(checkpoint) not in MODEL_ALIASES and not (checkpoint / CONFIG_NAME).is_file():
            raise ValueError(
                f"--checkpoint {str(checkpoint)!r} is neither a model folder (no {CONFIG_NAME} in it) nor an alias "
                f"({', '.join(MODEL_ALIASES)}); name the stock model the learners file was trained from"
            )
        return
    if not (checkpoint / CONFIG_NAME).is_file():
        raise ValueError(_no_model_folder(checkpoint, args.executorch is not None))
    if args.merge is not None:
        if args.merge.exists() and not args.merge.is_dir():
            raise ValueError(f"--merge {str(args.merge)!r} is a file; name a folder to write the model into")
        if args.merge.resolve() == checkpoint.resolve():
            raise ValueError("--merge must name a new folder, not the checkpoint itself")
    elif args.executorch is not None:
        if args.learners is None and not has_far_layout(weight_files(checkpoint)):
            raise ValueError(
                f"--checkpoint {str(checkpoint)!r} holds a plain model, with no FAR learners to train on a device; "
                "export a checkpoint saved from a reconfigured model, or add --learners FILE to apply a learners file"
            )
    elif args.learners_only.is_dir():
        raise ValueError(f"--learners-only {str(args.learners_only)!r} is a folder; name a .safetensors file")
    elif not has_far_layout(weight_files(checkpoint)):
        raise ValueError(
            f"--checkpoint {str(checkpoint)!r} holds a plain model, with no FAR learners to export; "
            "export a checkpoint saved from a reconfigured model (far.save_pretrained after FAR training)"
        )


def _export_executorch(args: argparse.Namespace) -> int:
    with quietly():  # transformers imports torchao (which executorch brings) with its model code
        if args.learners is None:
            model, tokenizer = load_trained_model(args.checkpoint)
        else:
            predictor = recipes.Predictor.load(args.checkpoint, learners=args.learners)
            model, tokenizer = predictor.model, predictor.tokenizer
    micro = _micro_batch(args)
    print(
        f"exporting programs for batches of {args.batch_size} in {args.batch_size // max(micro, 1)} passes of {micro}, "
        f"XNNPACK {args.xnnpack}: {_LOWERING[args.xnnpack]}",
        flush=True,
    )
    result = device.export_executorch(
        model,
        tokenizer,
        args.executorch,
        batch_size=args.batch_size,
        micro_batch_size=micro,
        max_length=args.max_length,
        optimizer=args.optimizer,
        lr=args.lr if args.lr is not None else LEARNING_RATES["encoder"][args.optimizer],
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm or None,
        schedule={"warmup_steps": args.warmup_steps} if args.schedule == "linear" else None,
        xnnpack=args.xnnpack,
        overwrite=args.overwrite,
    )
    print(f"wrote ExecuTorch programs to {result.out_dir}:")
    for name, size in result.sizes.items():
        print(f"  {name}: {_size(size)}")
    return 0


def _export_peft(args: argparse.Namespace) -> int:
    # the stock base with the head the file records: loaded with the file (which checks that it belongs to this
    # base), then the file taken off again, bit for bit
    base = far.unload_learners(recipes.Predictor.load(args.checkpoint, learners=args.learners).model)
    if is_reconfigured(base):
        restore(base)
    out = save_peft_adapter(base, args.learners, args.peft, overwrite=args.overwrite)
    config = json.loads((out / "adapter_config.json").read_text())
    ranks = sorted(config["rank_pattern"].values())
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"wrote a PEFT LoRA adapter to {out}: {len(ranks)} projections as LoRA factors (r {ranks[0]}-{ranks[-1]})"
        if ranks
        else f"wrote a PEFT LoRA adapter to {out}: no FFN learners changed"
    )
    print(f"  saved whole (modules_to_save): {len(config['modules_to_save'] or [])} modules; size {_size(size)}")
    print(f"  load it with peft.PeftModel.from_pretrained(<the base {args.checkpoint} with its head>, {str(out)!r})")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.from_executorch is not None:
        manifest, model = check_state_args(args)
        lock.hold(args.learners_only)
        return export_state_learners(args, manifest, model)
    if args.state is not None or args.values_dtype is not None:
        raise ValueError(
            "--state and --values-dtype convert a device's training state: use them with --from-executorch"
        )
    if args.learners is not None and args.executorch is None and args.peft is None:
        raise ValueError("--learners names the file to export: use it with --executorch OUT or --peft OUT")
    fill_defaults(args)
    _check_args(args)
    # Last of the checks, for both exports (an encoder's checkpoint, a causal LM): the flags and inputs first.
    if args.executorch is not None and importlib.util.find_spec("executorch") is None:
        raise ValueError(f"--executorch needs executorch, which this environment lacks: {INSTALL_HINT}")
    lock.hold(args.peft or args.executorch or args.merge or args.learners_only)
    if args.model is not None:
        return export_lm_peft(args) if args.peft is not None else export_lm(args)
    if args.peft is not None:
        return _export_peft(args)
    if args.executorch is not None:
        return _export_executorch(args)
    model = from_pretrained(args.checkpoint)
    if args.merge is not None:
        if is_reconfigured(model):
            restore(model)
        copied = [args.checkpoint / name for name in TOKENIZER_FILES if (args.checkpoint / name).is_file()]
        with atomic_dir(args.merge) as tmp:
            write_pretrained(model, tmp)
            for file in copied:
                shutil.copy2(file, tmp / file.name)
        files = sorted(p for p in args.merge.iterdir() if p.is_file())
        print(f"wrote a plain Hugging Face model to {args.merge}: {', '.join(p.name for p in files)}")
        print(f"size: {_size(sum(p.stat().st_size for p in files))}")
        return 0
    path = save_learners(model, args.learners_only)
    size = path.stat().st_size
    full = sum(f.stat().st_size for f in weight_files(args.checkpoint))
    print(f"wrote the learners-only file {path}")
    print(f"size: {_size(size)}, {100 * size / max(full, 1):.1f}% of the full checkpoint's {_size(full)}")
    return 0
