"""`far export --executorch OUT --model NAME`: a GGUF causal LM exported with FAR's layout for text.

far export --model smollm2-135m --executorch OUT/ --train-file notes/
"""

from __future__ import annotations

import argparse

from far.device.export import check_out_dir
from far.device.lm_export import export_causal_lm, load_texts, priming_chunks, reconfigure_for_export
from far.models import is_causal_lm, load_lean_lm
from far.recipes.own_texts import TEXT_DEFAULTS
from far.training.options import LEARNING_RATES


def _size(n_bytes: int) -> str:
    return f"{n_bytes:,} bytes ({n_bytes / 2**20:.2f} MiB)"


class Default(int):
    """A flag's default number, told apart from the same number given (--model has defaults of its own)."""


class DefaultText(str):
    """A flag's default choice, told apart from the same choice given."""


# --executorch's defaults for a causal LM (--model): far train's on texts, in micro-batches of one chunk (the least
# planned memory), at a constant rate, as far train on texts steps.
_LM_DEFAULTS = {
    "batch_size": TEXT_DEFAULTS["adamw"]["batch_size"],
    "max_length": TEXT_DEFAULTS["adamw"]["max_length"],
    "micro_batch_size": 1,
    "schedule": "constant",
    "xnnpack": "none",
}


def fill_defaults(args: argparse.Namespace) -> None:
    """Replace, with --model, the encoder's defaults that the command line did not give by the causal LM's."""
    if args.model is None:
        return
    for name, value in _LM_DEFAULTS.items():
        if getattr(args, name) is None or isinstance(getattr(args, name), (Default, DefaultText)):
            setattr(args, name, value)


def check_lm_args(args: argparse.Namespace) -> None:
    """`--model`'s refusals, made before the model loads."""
    if args.executorch is None:
        raise ValueError("--model exports a GGUF causal LM for the device: add --executorch OUT")
    if not is_causal_lm(args.model):
        raise ValueError(
            f"--model {args.model!r} is not a GGUF causal LM (smollm2-135m, gemma3-270m or a .gguf file); export an "
            "encoder's FAR checkpoint with --checkpoint DIR"
        )
    if args.learners is not None:
        raise ValueError(
            "--learners with --model (continuing a text run's training on the device) is not exported yet; export "
            "the stock model with --model NAME (and --train-file to choose the learners from your texts)"
        )
    refused = [
        flag
        for flag, given in (
            ("--schedule linear", args.schedule == "linear"),
            ("--warmup-steps", args.warmup_steps),
            (f"--xnnpack {args.xnnpack}", args.xnnpack != "none"),
        )
        if given
    ]
    if refused:
        raise ValueError(
            f"{', '.join(refused)} is not available with --model: a causal LM's export trains at a constant rate (as "
            "far train on texts) with the training program undelegated; drop it"
        )
    if args.optimizer == "sgd" and args.lr is None:
        raise ValueError("far has no default SGD rate for a causal LM's texts: give --lr with --optimizer sgd")
    if args.train_file is not None and not args.train_file.exists():
        raise ValueError(f"--train-file {str(args.train_file)!r} does not exist; name a folder or file of texts")
    check_out_dir(args.executorch, args.overwrite)


def export_lm(args: argparse.Namespace) -> int:
    try:
        model, tokenizer = load_lean_lm(args.model)
    except ModuleNotFoundError as error:  # an alias whose package is not installed: its message names it
        raise ValueError(str(error)) from None
    texts = None if args.train_file is None else load_texts(args.train_file, tokenizer, args.max_length)
    chunks = None if texts is None else priming_chunks(texts)
    config = reconfigure_for_export(model, chunks)
    how = "by weight magnitude" if chunks is None else f"by gradient priming on {len(chunks)} chunks of your texts"
    print(
        f"exporting {args.model} for training on text: layers {config.freeze_layers}-{len(model.layers) - 1} of "
        f"{len(model.layers)} train, {config.retention:.0%} of the FFN nodes as learners (chosen {how}); batches of "
        f"{args.batch_size} chunks of {args.max_length} tokens in passes of {args.micro_batch_size}",
        flush=True,
    )
    result = export_causal_lm(
        model,
        tokenizer,
        args.executorch,
        batch_size=args.batch_size,
        micro_batch_size=args.micro_batch_size,
        max_length=args.max_length,
        optimizer=args.optimizer,
        lr=args.lr if args.lr is not None else LEARNING_RATES["causal LM texts"]["adamw"],
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm or None,
        far_config=config,
        overwrite=args.overwrite,
        texts=texts,
    )
    print(f"wrote ExecuTorch programs to {result.out_dir} in {sum(result.seconds.values()):.0f} s:")
    for name, size in result.sizes.items():
        print(f"  {name}: {_size(size)}")
    return 0
