"""`far export --model NAME`: a GGUF causal LM exported with FAR's layout for text, or a user's file as a PEFT adapter.

far export --model smollm2-135m --executorch OUT/ --train-file notes/
far export --model smollm2-135m --executorch OUT/ --train-file notes/ --generate 512
far export --model smollm2-135m --executorch OUT/ --learners runs/notes/ --train-file more-notes/
far export --from-executorch OUT/ --state user.safetensors --learners-only notes-learners.safetensors
far export --model smollm2-135m --learners alice.safetensors --peft alice-lora/ --base-out smollm2-hf/
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from far.device.export import check_out_dir
from far.device.lm_export import (
    export_causal_lm,
    load_texts,
    priming_chunks,
    reconfigure_for_export,
    reconfigure_from_learners,
)
from far.device.lm_generate import check_cache_length
from far.device.lm_learners import lm_to_learners
from far.device.manifest import NEXT_TOKEN, read_manifest
from far.device.state import read_state
from far.llm.gguf_file import load_lean_model
from far.llm.lean_learners import values_dtype
from far.methods.lean_hf import read_base_record, save_hf_base
from far.methods.peft_adapter import check_output_dir
from far.methods.peft_lean import check_base_dir, check_learners_file, save_lean_peft_adapter
from far.models import MODEL_ALIASES, find_gguf, is_causal_lm, load_lean_lm
from far.recipes.own_texts import SHIPPED_DTYPE, TEXT_DEFAULTS
from far.saving.safetensors_file import LEARNERS_FILE
from far.training.options import LEARNING_RATES


def _size(n_bytes: int) -> str:
    return f"{n_bytes:,} bytes ({n_bytes / 2**20:.2f} MiB)"


_MAX_LENGTH = object()  # --generate without a number: a cache of --max-length positions (argparse converts a str)


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
    if args.executorch is None and args.peft is None:
        raise ValueError(
            "--model exports a GGUF causal LM for the device (add --executorch OUT) or a learners file of it as a "
            "PEFT adapter (add --learners FILE --peft OUT)"
        )
    if not is_causal_lm(args.model):
        raise ValueError(
            f"--model {args.model!r} is not a GGUF causal LM (smollm2-135m, gemma3-270m or a .gguf file); export an "
            "encoder's FAR checkpoint with --checkpoint DIR"
        )
    if args.peft is not None:
        return _check_peft_args(args)
    if args.base_out is not None:
        raise ValueError("--base-out writes the base of a PEFT adapter: use it with --peft OUT")
    if args.generate is not None:
        check_cache_length(generate_length(args))
    if args.learners is not None:
        learners_file(args.learners)
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


def learners_file(path: Path) -> Path:
    """The learners file `--learners PATH` names: a file, or a text run's folder holding its learners file."""
    found = path / LEARNERS_FILE if path.is_dir() else path
    if not found.is_file():
        where = f"a folder without {LEARNERS_FILE} (not a far train --train-file run's)" if path.is_dir() else "no file"
        raise ValueError(
            f"--learners {str(path)!r} is {where}; name a causal LM's learners file (far train --train-file, far "
            "export --from-executorch) or the run folder far train wrote it into"
        )
    return found


def _check_peft_args(args: argparse.Namespace) -> None:
    if args.learners is None:
        raise ValueError("--peft writes a learners file as an adapter: add --learners FILE (a far train run's)")
    if not args.learners.is_file():
        raise ValueError(f"--learners {str(args.learners)!r} is not a file")
    if args.train_file is not None:
        raise ValueError("--train-file chooses the learners of an --executorch export; --peft exports those of FILE")
    if args.model.endswith(".gguf") and not Path(args.model).is_file():
        raise ValueError(f"--model {args.model!r}: no such GGUF file")
    check_output_dir(args.peft, args.overwrite)
    base = args.base_out
    if base is not None and base.exists():
        if not base.is_dir():
            raise ValueError(f"--base-out {str(base)!r} is a file; name a folder for the base")
        if any(base.iterdir()) and read_base_record(base) is None:
            raise ValueError(
                f"--base-out {str(base)!r} holds files but no base that far export wrote; name a new folder"
            )


def export_lm_peft(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:  # a first-order run's learners are float32: its base is the model stored in float32 (as far generate)
        path = Path(args.model) if args.model.endswith(".gguf") else find_gguf(args.model)
        model = load_lean_model(path, dtype=values_dtype(args.learners))  # no tokenizer: the adapter needs none
    except ModuleNotFoundError as error:  # an alias whose package is not installed: its message names it
        raise ValueError(str(error)) from None
    check_learners_file(model, args.learners)  # a file of another base is refused before anything is written
    base = args.base_out
    if base is not None and read_base_record(base) is not None:
        check_base_dir(base, model)
        print(f"the base {base} holds this model's weights: used as it is")
    elif base is not None:
        save_hf_base(model, base)
        size = sum(p.stat().st_size for p in base.iterdir() if p.is_file())
        print(f"wrote the transformers base to {base}: {_size(size)}")
    out = save_lean_peft_adapter(model, args.learners, args.peft, base_dir=base, overwrite=args.overwrite)
    config = json.loads((out / "adapter_config.json").read_text())
    ranks = sorted(config["rank_pattern"].values()) or [0]
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"wrote a PEFT LoRA adapter to {out} in {time.perf_counter() - started:.1f} s: {len(config['rank_pattern'])} "
        f"FFN projections as LoRA factors (r {ranks[0]}-{ranks[-1]}), {len(config['modules_to_save'] or [])} "
        f"modules saved whole (modules_to_save); {_size(size)}"
    )
    where = base if base is not None else "BASE (far export --base-out BASE, once per base)"
    print(
        f"  load it with peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(where)!r}), "
        f"{str(out)!r})"
    )
    return 0


def export_lm(args: argparse.Namespace) -> int:
    try:
        model, tokenizer = load_lean_lm(args.model)
    except ModuleNotFoundError as error:  # an alias whose package is not installed: its message names it
        raise ValueError(str(error)) from None
    texts = None if args.train_file is None else load_texts(args.train_file, tokenizer, args.max_length)
    if args.learners is None:
        chunks = None if texts is None else priming_chunks(texts)
        config = reconfigure_for_export(model, chunks)
        depth, share = config.freeze_layers, f"{config.retention:.0%}"
        how = "by weight magnitude" if chunks is None else f"by gradient priming on {len(chunks)} chunks of your texts"
    else:  # a user's training, continued: the file's learners, values and frozen depth
        config, file = None, learners_file(args.learners)
        depth = reconfigure_from_learners(model, file)
        nodes = sum(len(layer.mlp.learner_nodes) for layer in model.layers)
        share = f"{nodes / (len(model.layers) * model.config.intermediate_size):.0%}"
        how = f"and trained, as {file} holds them"
    print(
        f"exporting {args.model} for training on text: layers {depth}-{len(model.layers) - 1} of "
        f"{len(model.layers)} train, {share} of the FFN nodes as learners (chosen {how}); batches of "
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
        generate_length=generate_length(args),
    )
    print(f"wrote ExecuTorch programs to {result.out_dir} in {sum(result.seconds.values()):.0f} s:")
    for name, size in result.sizes.items():
        print(f"  {name}: {_size(size)}")
    return 0


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    """`--from-executorch OUT --state FILE`: a causal LM export's training state back to far, as a learners file."""
    parser.add_argument(
        "--from-executorch",
        type=Path,
        metavar="OUT",
        help="with --state FILE and --learners-only FILE: a causal LM's export folder (far export --model NAME "
        "--executorch OUT), whose training state becomes a learners file for its GGUF model (far generate --learners)",
    )
    parser.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="with --from-executorch: the training state to convert (far_train's --state FILE)",
    )
    parser.add_argument(
        "--values-dtype",
        choices=("bfloat16", "float32"),
        help="with --from-executorch: the learners file's values, bfloat16 (default, as far train writes them: about "
        "a byte a value) or float32 (the state's values exactly, four bytes a value)",
    )


def add_generate_arguments(group: argparse._ArgumentGroup) -> None:
    """`--generate [POSITIONS]`: a causal LM's export also writes generate.pte (greedy decoding on the device)."""
    group.add_argument(
        "--generate",
        nargs="?",
        type=int,
        const=_MAX_LENGTH,
        metavar="POSITIONS",
        help="with --model: also write generate.pte, greedy decoding over a KV cache of POSITIONS tokens (the prompt "
        "and the written ones; default --max-length) with the state's trained tensors, run by far_generate; it holds "
        "the frozen weights again (212 MB for SmolLM2, beside 311 MB for bottom.pte and train.pte)",
    )


def generate_length(args: argparse.Namespace) -> int | None:
    """The generate program's cache length `--generate` asks for (None: no generate program)."""
    return args.max_length if args.generate is _MAX_LENGTH else args.generate


def _stock_model(args: argparse.Namespace, manifest: dict) -> str:
    """The export's base GGUF model: --model, or the alias whose GGUF file the manifest names."""
    if args.model is not None:
        if not is_causal_lm(args.model):
            raise ValueError(f"--model {args.model!r} is not a GGUF causal LM (smollm2-135m, gemma3-270m or a .gguf)")
        if args.model.endswith(".gguf") and not Path(args.model).is_file():
            raise ValueError(f"--model {args.model!r}: no such GGUF file")
        return args.model
    base = manifest.get("base")
    name = base.get("gguf") if isinstance(base, dict) else None
    aliases = [alias for alias, known in MODEL_ALIASES.items() if name is not None and known.gguf_file == name]
    if not aliases:
        raise ValueError(
            f"the export's base is {name or 'a model built in Python'}, no alias's GGUF file: name it with --model "
            "FILE.gguf"
        )
    return aliases[0]


def check_state_args(args: argparse.Namespace) -> tuple[dict, str]:
    """`--from-executorch`'s refusals, made before the model loads: the manifest, the state read and checked."""
    if args.learners_only is None:
        raise ValueError(
            "--from-executorch writes a training state as a learners file: add --learners-only FILE (and --state "
            "STATE), without --merge, --executorch or --peft"
        )
    given = [f for f, v in (("--checkpoint", args.checkpoint), ("--learners", args.learners)) if v is not None]
    given += [f for f, v in (("--train-file", args.train_file), ("--base-out", args.base_out)) if v is not None]
    given += ["--generate"] if args.generate is not None else []
    if given:
        raise ValueError(f"{', '.join(given)}: not used with --from-executorch OUT --state FILE; drop it")
    if args.state is None or not args.state.is_file():
        raise ValueError(
            f"--from-executorch needs --state FILE, the training state (far_train's --state): "
            f"{'none given' if args.state is None else repr(str(args.state)) + ' is not a file'}"
        )
    out = args.learners_only
    if out.is_dir():
        raise ValueError(f"--learners-only {str(out)!r} is a folder; name a .safetensors file")
    if out.resolve() == args.state.resolve():
        raise ValueError("--learners-only names the state file itself; write the learners file beside it")
    manifest = read_manifest(args.from_executorch, verify_programs=False, objective=NEXT_TOKEN)
    read_state(args.state, manifest)  # a damaged state, or one of another export, is refused here
    return manifest, _stock_model(args, manifest)


def export_state_learners(args: argparse.Namespace, manifest: dict, model: str) -> int:
    started = time.perf_counter()
    try:
        gguf = Path(model) if model.endswith(".gguf") else find_gguf(model)
    except ModuleNotFoundError as error:  # an alias whose package is not installed: its message names it
        raise ValueError(str(error)) from None
    dtype = torch.float32 if args.values_dtype == "float32" else SHIPPED_DTYPE
    path = lm_to_learners(args.from_executorch, args.state, load_lean_model(gguf), args.learners_only, dtype)
    size, full = path.stat().st_size, gguf.stat().st_size
    print(
        f"wrote the learners file {path} in {time.perf_counter() - started:.1f} s: {_size(size)}, "
        f"{100 * size / full:.1f}% of {gguf.name} ({str(dtype).removeprefix('torch.')} values, "
        f"{len(manifest['trainable'])} trained tensors)"
    )
    print(f"  generate with it: far generate --model {model} --learners {path} --prompt TEXT")
    return 0
