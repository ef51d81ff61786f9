"""The arguments of the `far` training commands (`RunSettings`' flags), their argparse types, and the data's.

`far.cli.common.register_training_command` adds them to every training command; `far demo` and
`far eval` take the data arguments and a few types.
"""

from __future__ import annotations

import argparse

from far.config import AUTO, PRESETS
from far.data.locate import DATA_DIR_ENV, DEFAULT_DATA_DIR
from far.methods import METHODS
from far.models import DEFAULT_MODEL, MODEL_ALIASES, RUNTIMES
from far.recipes.settings import DISTRIBUTED, OPTIMIZERS, TRAINABLE_DTYPES
from far.training.options import PRIMING_SCORES, check_length
from far.training.precision import PRECISIONS


def fraction_or_steps(text: str) -> float | int:
    """argparse type: "0.1" is a fraction of the run's steps, "50" a number of steps (as far.finetune takes them)."""
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is neither a fraction nor a number of steps") from None
    try:
        return check_length("the length", value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def layers_or_auto(text: str) -> int | str:
    """argparse type of --freeze-layers: a number of bottom layers, or "auto"."""
    if text == AUTO:
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of layers nor {AUTO!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"the number of frozen layers must be >= 0, got {value}")
    return value


def retention_or_auto(text: str) -> float | str:
    """argparse type of --retention: a fraction of FFN nodes, or "auto" (FARConfig checks the range)."""
    if text == AUTO:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a fraction of FFN nodes (e.g. 0.2) nor {AUTO!r}"
        ) from None


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"local data root with glue/<Task>/ and squad/ (default: ${DATA_DIR_ENV}, else {DEFAULT_DATA_DIR} from "
        "the current folder or the far checkout, else the hub)",
    )
    parser.add_argument("--max-eval-samples", type=int, default=None, help="evaluate on the first N examples only")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of every training command (`RunSettings`); hyper-parameters left None take the task's defaults."""
    _add_model_and_method(parser)
    _add_optimization(parser)
    _add_lora(parser)
    _add_freezing(parser)
    _add_precision_and_memory(parser)
    _add_run_outputs(parser)


def _add_model_and_method(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for the model, the method and FAR's configuration."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"alias ({', '.join(MODEL_ALIASES)}), Hugging Face model folder or hub name (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--method",
        choices=list(METHODS),
        default="far",
        help="; ".join(f"{m.name}: {m.help}" for m in METHODS.values()) + " (default: far)",
    )
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default=None,
        help="a named FAR configuration: auto (the default of --method far: --retention auto --freeze-embeddings "
        "--freeze-layers auto --cache-frozen) or paper (the FAR paper's: --retention 0.4, nothing else frozen); a flag "
        "given beside it changes that part only",
    )
    parser.add_argument(
        "--retention",
        type=retention_or_auto,
        default=None,
        metavar="R|auto",
        help="fraction of FFN nodes kept trainable by far/random; far: auto picks each layer's fraction from the "
        "priming scores. Given, it says the configuration flag by flag: the embeddings and layers are then frozen "
        "only if --freeze-embeddings/--freeze-layers say so (default: far: the automatic configuration, see --preset; "
        "random: 0.4; MeZO + FAR on a GGUF causal LM: 0.1, all in the top third of the layers)",
    )
    parser.add_argument(
        "--layout",
        default=None,
        metavar="FILE",
        help="a layout that far prime wrote for this base and task: train with its learners and frozen depth from "
        "the first step, no priming (--method far; it sets the configuration, so no --preset, --retention, "
        "--freeze-layers or --freeze-embeddings beside it); a layout for another base is refused before anything "
        "is written",
    )
    parser.add_argument(
        "--attention-retention",
        type=float,
        default=None,
        help="also split attention: fraction of each layer's heads kept trainable by far/random (default: attention "
        "untouched)",
    )


def _add_optimization(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for the optimizer, the schedule and the data the run takes."""
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adamw",
        help="(default: adamw); zo-batched: a batched one-sided zeroth-order estimator, for causal LMs on texts",
    )
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: per task and optimizer)")
    parser.add_argument("--epochs", type=float, default=None, help="training epochs (default: per task)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    parser.add_argument("--batch-size", type=int, default=None, help="training batch size (default: per task)")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="evaluation batch size (default: 64)")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per sequence (default: per task)")
    parser.add_argument("--max-train-samples", type=int, default=None, help="train on the first N examples only")
    parser.add_argument(
        "--validation-from-train",
        type=float,
        default=None,
        metavar="F",
        help="evaluate on a fraction F of the training data held out (seeded by --seed) instead of the "
        "validation split: to choose hyper-parameters without the dev set",
    )
    parser.add_argument(
        "--priming",
        type=fraction_or_steps,
        default=0.1,
        help="steps that prime FAR's node scores: a fraction of the run (0.1) or a number of steps (50)",
    )
    parser.add_argument(
        "--priming-scores",
        choices=PRIMING_SCORES,
        default="change",
        help="far: score nodes by how far the priming steps move them (change), or by their gradients over the "
        "priming steps' batches, with no update, before the first step (gradient: cheaper, every step then trains "
        "the reconfigured model) (default: change)",
    )
    parser.add_argument(
        "--warmup",
        type=fraction_or_steps,
        default=None,
        help="learning-rate warm-up: a fraction or a number of steps (default: per task)",
    )
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: 0)")
    parser.add_argument("--grad-accum", type=int, default=1, help="batches per optimizer step (default: 1)")
    parser.add_argument("--mezo-eps", type=float, default=1e-3, help="MeZO perturbation size (default: 0.001)")
    parser.add_argument(
        "--mezo-directions", type=int, default=1, help="MeZO random directions per step (default: 1; zo-batched: 4)"
    )


def _add_lora(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for LoRA (--method lora)."""
    lora = parser.add_argument_group("LoRA (--method lora, Hugging Face PEFT; defaults are PEFT's)")
    lora.add_argument("--lora-r", type=int, default=8, help="adapter rank (default: 8)")
    lora.add_argument("--lora-alpha", type=int, default=8, help="scale numerator, alpha / r (default: 8)")
    lora.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapters (default: 0)")
    lora.add_argument(
        "--lora-target-modules",
        nargs="+",
        default=None,
        metavar="NAME",
        help="modules to adapt (default: PEFT's for the architecture, e.g. query value for BERT)",
    )


def _add_freezing(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for what stays frozen, and what is kept computed."""
    parser.add_argument(
        "--freeze-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also freeze the embeddings (every method but lora) (default: on in far's automatic configuration, "
        "else off)",
    )
    parser.add_argument(
        "--freeze-layers",
        type=layers_or_auto,
        default=None,
        metavar="K|auto",
        help="freeze the embeddings and the bottom K layers whole, so that backward stops at layer K (every "
        "method); auto: K from FAR's priming scores (far/random); 0: none (default: auto in far's automatic "
        "configuration, else none)",
    )
    parser.add_argument(
        "--keep-primed-frozen",
        dest="reset_frozen",
        action="store_false",
        help="far/random: keep the primed values of what FAR freezes (by default they go back to the stock model's, "
        "so that the learners file applies to the stock model; with this flag it fits only this run's model)",
    )
    parser.add_argument(
        "--prime-frozen",
        action="store_const",
        const=True,
        default=None,
        help="far/random: train during priming what FAR freezes up front (the embeddings with --freeze-embeddings, "
        "the bottom K layers with --freeze-layers K), as the FAR paper primes the whole model; by default they are "
        "frozen from the first step, since the surgery puts their stock values back anyway",
    )
    parser.add_argument(
        "--cache-frozen",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --freeze-layers: run the frozen bottom without dropout and keep its output per training example, "
        "so that after the first epoch a step runs only the layers above it (not with --memory-budget) (default: on "
        "in far's automatic configuration, else off)",
    )
    parser.add_argument(
        "--group-by-length",
        action="store_true",
        help="batch examples of similar lengths together: every example once an epoch, far less padding (off by "
        "default for every method: docs/results.md says why)",
    )


def _add_precision_and_memory(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for precision, memory and which code runs the encoder."""
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast for training and evaluation")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="of the training steps: fp32, bf16 (autocast), or auto: bf16 where the CPU multiplies it natively "
        "(avx512_bf16 or amx_bf16) or the CUDA GPU supports it, fp32 elsewhere; metrics.json says which ran and why. "
        "bf16 steps took 0.43x of fp32's on an avx512_bf16 CPU, but lost CoLA points (docs/results.md) "
        "(default: fp32)",
    )
    parser.add_argument(
        "--trainable-dtype",
        choices=TRAINABLE_DTYPES,
        default="bfloat16",
        help="a GGUF causal LM: storage of the weights MeZO trains (bf16: stochastically rounded updates; "
        "computed in fp32 either way) (default: bfloat16)",
    )
    parser.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        metavar="MIB",
        help="keep the whole process's peak memory (RSS) under MIB MiB: micro-batches with gradient accumulation "
        "and FAR's cheap levers as needed; refused up front when it cannot fit",
    )
    parser.add_argument(
        "--runtime",
        choices=("auto", *RUNTIMES),
        default="auto",
        help="an encoder's code: transformers' model classes, or lean (far's own BERT, which leaves transformers' "
        "model code unimported: ~140 MiB less memory); auto: lean under --memory-budget where it runs the model "
        "(BERT), else transformers (default: auto)",
    )


def _add_run_outputs(parser: argparse.ArgumentParser) -> None:
    """The training commands' arguments for evaluation, seeds, outputs, checkpoints and resuming."""
    parser.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (always at the end)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the new head, data order, dropout, selection and MeZO (default: 0)"
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        help="where metrics, predictions and the log go (default: runs/<task>-<model>-<method>)",
    )
    parser.add_argument(
        "--model-dir", default=None, help="where the fine-tuned model is saved (default: <output-dir>/model)"
    )
    parser.add_argument("--no-save-model", action="store_true", help="do not save the fine-tuned model")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="write a checkpoint to <output-dir>/checkpoints every N steps (written whole or not at all; the last 2 "
        "kept)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue a killed run from the newest intact checkpoint in --output-dir, with the same options: it "
        "ends as the uninterrupted run would",
    )
    parser.add_argument(
        "--distributed",
        choices=DISTRIBUTED,
        default="ddp",
        help="under torchrun: ddp keeps a whole replica of the model in every process; fsdp shards each layer's "
        "tensors over the processes (FSDP2) for an encoder, AdamW's moments and gradients for a GGUF causal LM "
        "(AdamW, no --memory-budget); one process trains unsharded (default: ddp; docs/distributed.md)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run that --output-dir holds (its files only); without it, a folder that holds a run is "
        "refused before anything loads",
    )
