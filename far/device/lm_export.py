"""`export_causal_lm`: a lean causal LM's FAR layout as an ExecuTorch folder that trains it on text.

The folder is `far.device.manifest`'s, with objective "next_token":

    train.pte         the layers above the frozen depth, the final norm and the next-token loss over the
                      vocabulary in slices (`far.device.lm_view.LMTop`): inputs (hidden (B, T, hidden),
                      input_ids (B, T)), outputs loss, hits, then the gradients and the trainable tensors
    bottom.pte        the embedding and the frozen bottom layers, forward only: input_ids -> hidden
    generate.pte      on request (`generate_length`): greedy decoding over a KV cache, a token a call, its trained
                      tensors taken from the state (`far.device.lm_generate`)
    tokenizer.json    the GGUF model's tokenizer; chunks are packed, max_length tokens, no padding
    text.safetensors  with `texts`: the user's texts as packed training and held-out chunks (`far.device.lm_text`)
    manifest.json     the shapes, the layout (learners, frozen_layers), the optimizer, the base GGUF file
    state.safetensors the trainable tensors at step 0, named as in the lean model

    >>> model, tokenizer = far.models.load_lean_lm("smollm2-135m")
    >>> reconfigure_for_export(model, chunks=None)    # FAR as `far train` lays it out (magnitude scores)
    >>> export_causal_lm(model, tokenizer, "OUT", batch_size=4, max_length=256, optimizer="adamw", lr=1e-4)
    >>> reconfigure_from_learners(model, "notes-learners.safetensors")   # or: a user's training, continued
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import torch
from torch import Tensor

from far.config import FARConfig
from far.data.texts import DEFAULT_HOLDOUT, TextChunks, load_text_chunks
from far.device.export import ExportResult, check_out_dir, micro_batch, write_folder
from far.device.lm_generate import GENERATE_INPUTS, LMDecoder, check_cache_length, generation_program
from far.device.lm_text import CHUNKS, write_chunks
from far.device.lm_view import lm_views
from far.device.lowering import lower_views
from far.device.manifest import FORMAT, FORMAT_VERSION, NEXT_TOKEN, sha256_file, tensor_spec
from far.device.optim import optimizer_settings
from far.llm.lean_far import ffn_names, lean_layout, prime_and_split, set_trainable
from far.llm.lean_model import LeanCausalLM
from far.llm.lean_saving import load_trained
from far.llm.text_steps import MAX_PRIMING_CHUNKS, PRIMING_MICRO_BATCH, priming_loss
from far.llm.tokenizer import LeanTokenizer
from far.seeds import derive_seed

logger = logging.getLogger(__name__)


def reconfigure_for_export(
    model: LeanCausalLM, chunks: Tensor | None, config: FARConfig | None = None, retention_given: bool = False
) -> FARConfig:
    """FAR on a stock lean model as `far train --train-file` lays it out for AdamW, in place; returns its config.

    The bottom two thirds of the layers frozen whole, 10% of all FFN nodes as learners above them, trained
    weights in fp32; learners chosen by gradient priming on `chunks` (N, T) of the user's text, or, with
    none, by weight magnitude (no data needed).
    """
    layout = lean_layout(
        config or FARConfig(),
        len(model.layers),
        torch.float32,
        ffn="learners",
        frozen_layers=None,
        retention_given=retention_given,
    )
    batches = [] if chunks is None else list(chunks.split(PRIMING_MICRO_BATCH))
    scoring = "magnitude" if chunks is None else "gradient"
    prime_and_split(model, batches, priming_loss(layout.frozen_layers), layout.far, torch.float32, scoring)
    return layout.far


def reconfigure_from_learners(model: LeanCausalLM, path: str | os.PathLike) -> int:
    """A user's fine-tune on a stock lean model, in place, laid out as the export trains it on; returns its depth.

    The learners file (`far train --train-file`'s, or `far export --from-executorch`'s) gives the learner
    nodes, the trained values and what trains (`far.llm.lean_saving.load_trained`); the trained weights are
    then held in fp32, as the device steps them (values the file kept in bf16 are exact in fp32).

    Raises:
        ValueError: the file belongs to another GGUF file or model shape, is damaged
            (`far.llm.lean_learners.LeanLearnersFileError`), trains its first layer (the device trains above a
            frozen bottom), or trains other weights than FAR's layout for text above its frozen layers. The model
            then holds part of the file: load it again.
    """
    load_trained(model, path, base=model.source.path)  # checks the file against this model before changing it
    if any(layer.mlp.learner_nodes is None for layer in model.layers):
        raise ValueError(
            f"{path} trains whole FFNs, not FAR's learners; the device exports FAR's layout: train with FAR "
            "(far train's default on texts)"
        )
    depth = model.lowest_trainable_layer()
    if depth == 0 or depth == len(model.layers):
        raise ValueError(
            f"{path} trains {'its first layer' if depth == 0 else 'nothing'}; the device trains the layers above a "
            "frozen bottom (FAR with depth, far train's default on texts)"
        )
    trained = {id(w) for w in model.trainable_weights()}
    set_trainable(model, "learners", torch.float32, frozen_layers=depth)  # the layout far.device.lm_to_learners reads
    if trained != {id(w) for w in model.trainable_weights()}:
        raise ValueError(
            f"{path} trains other weights than FAR's layout for text above layer {depth} (learners, attention and "
            "norms); the device exports that layout only"
        )
    for weight in model.trainable_weights():  # the norms set_trainable leaves as the file kept them
        if weight.stored.dtype != torch.float32:
            weight.stored = torch.nn.Parameter(weight.stored.detach().float(), requires_grad=False)
    return depth


def load_texts(train_file: str | os.PathLike, tokenizer: LeanTokenizer, max_length: int, seed: int = 0) -> TextChunks:
    """A user's texts packed as `far train --train-file` packs them (`far.data.texts`, its share held out).

    Raises:
        ValueError: texts that are not UTF-8, or shorter than one chunk (`far.data.texts`' messages).
    """
    return load_text_chunks(train_file, tokenizer, max_length, None, DEFAULT_HOLDOUT, seed)


def priming_chunks(texts: TextChunks, seed: int = 0) -> Tensor:
    """The chunks of a user's texts that gradient priming scores, as `far train --train-file` picks them.

    The training chunks (`load_texts`), the first `MAX_PRIMING_CHUNKS` of the run's first epoch order
    (seeded by `seed`).
    """
    train = texts.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(derive_seed(seed, 0)))
    return train[order[:MAX_PRIMING_CHUNKS]]


def plan_lm_export(model: LeanCausalLM, max_length: int) -> int:
    """Check that `model` can become a next-token training program of `max_length` tokens; returns its frozen
    depth. ValueError (what the export cannot represent, and what to do) before anything is built.
    """
    if not isinstance(model, LeanCausalLM):
        raise ValueError(
            f"export_causal_lm exports a causal LM on far's lean runtime (far.models.load_lean_lm), not "
            f"{type(model).__name__}; a sequence classifier exports with far.device.export_executorch"
        )
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(
            f"max_length must be a whole number >= 2 (a token and the one it predicts), got {max_length!r}"
        )
    if model.released_layers:
        raise ValueError(
            "this model's bottom layers were released (release_bottom) after a run kept their output; the export "
            "needs their weights: load the model again"
        )
    if any(layer.mlp.learner_nodes is None for layer in model.layers):
        raise ValueError(
            "this model's FFNs are not split by FAR, so the export has no learners to train: call "
            "far.device.lm_export.reconfigure_for_export(model, chunks) first (far export --executorch does)"
        )
    weights = model.trainable_weights()
    wrong = sorted({str(w.stored.dtype) for w in weights if w.stored.dtype != torch.float32})
    if wrong:
        raise ValueError(
            f"this model's trained weights are stored in {wrong} (a zeroth-order layout); the device trains with "
            "AdamW or SGD on float32 weights: reconfigure with far.device.lm_export.reconfigure_for_export"
        )
    depth = model.lowest_trainable_layer()
    if not weights or depth >= len(model.layers):
        raise ValueError("nothing in this model's layers is trainable; there is nothing to train on the device")
    if depth == 0:
        raise ValueError(
            "the device trains a causal LM above a frozen bottom (FAR with depth, far train's default for texts); "
            "this model trains its first layer: reconfigure it with freeze_layers > 0"
        )
    return depth


def _base(model: LeanCausalLM) -> dict:
    """The GGUF file the model was read from (None for a model built from tensors, as in the tests)."""
    if model.source is None:
        return {"gguf": None, "sha256": None}
    return {"gguf": model.source.path.name, "sha256": model.source.sha256()}


def export_causal_lm(
    model: LeanCausalLM,
    tokenizer: LeanTokenizer,
    out_dir: str | os.PathLike,
    *,
    batch_size: int,
    max_length: int,
    lr: float,
    optimizer: str = "adamw",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    micro_batch_size: int | None = None,
    far_config: FARConfig | None = None,
    bottom_xnnpack: bool = False,
    overwrite: bool = False,
    texts: TextChunks | None = None,
    generate_length: int | None = None,
) -> ExportResult:
    """Write a FAR-reconfigured lean causal LM as ExecuTorch programs that train it on packed text, atomically.

    Args:
        model: A lean causal LM with FAR's layout (`reconfigure_for_export`): a frozen bottom, FFN
            learners and the weights of the layers above in fp32. It is not changed.
        tokenizer: Its tokenizer (`far.llm.tokenizer.LeanTokenizer`), written as tokenizer.json.
        out_dir: The folder to write.
        batch_size, max_length: Chunks per optimizer step and their length in tokens.
        lr, optimizer, momentum, weight_decay, max_grad_norm: The device's optimizer
            (`far.device.optim`: "adamw" or "sgd" with momentum), at a constant lr.
        micro_batch_size: The programs' fixed batch, dividing `batch_size` (default `batch_size`).
        far_config: The FAR config the layout came from, recorded in the manifest.
        bottom_xnnpack: Delegate the bottom program to XNNPACK whole: faster per chunk (the bottom runs once
            per chunk), but its bf16 matrices are then all read into fp32 before the one delegate call
            (ExecuTorch plans 283 MiB for SmolLM2's 20 bottom layers, against 14 MiB without), and it takes
            minutes to lower.
        overwrite: Replace a folder that holds files already.
        texts: The user's texts as packed chunks (`load_texts`) of `max_length` tokens, written as
            text.safetensors for the runtimes to train on (`far.device.lm_text`).
        generate_length: Also write generate.pte, greedy decoding over a KV cache of this many positions (the
            prompt and the written tokens), its trained tensors read from the state (`far.device.lm_generate`);
            None: none. It holds the frozen weights again (212 MB for SmolLM2, 311 MB for the other two programs).

    Returns:
        An `ExportResult`: the folder, the files' sizes and the stages' seconds.

    Raises:
        ValueError: what cannot be exported, and why; nothing has been written.
    """
    out_dir = Path(out_dir)
    micro = micro_batch(batch_size, micro_batch_size)
    settings = optimizer_settings(
        optimizer, lr, momentum=momentum, weight_decay=weight_decay, max_grad_norm=max_grad_norm
    )
    check_out_dir(out_dir, overwrite)
    depth = plan_lm_export(model, max_length)
    if generate_length is not None:
        check_cache_length(generate_length)
    if texts is not None and texts.train.shape[1] != max_length:
        length = texts.train.shape[1]
        raise ValueError(f"texts are packed in chunks of {length} tokens; pack them in max_length={max_length} tokens")
    if not isinstance(tokenizer, LeanTokenizer):
        raise ValueError(
            f"expected the model's LeanTokenizer (far.models.load_lean_lm), got {type(tokenizer).__name__}"
        )
    base = _base(model)
    bottom, top = lm_views(model, depth)
    ids = torch.zeros(micro, max_length, dtype=torch.long)
    hidden = torch.zeros(micro, max_length, model.config.hidden_size)
    program, order, bottom_program, seconds = lower_views(
        top, (hidden, ids), bottom, (ids,), xnnpack="none", bottom_xnnpack=bottom_xnnpack, recompute=True
    )
    if generate_length is not None:
        start = time.perf_counter()
        generate_program = generation_program(LMDecoder(model, generate_length), order)
        seconds["generate"] = time.perf_counter() - start
    values = {n: p.detach() for n, p in top.named_parameters() if p.requires_grad}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "objective": NEXT_TOKEN,
        "model_type": model.config.arch,
        "batch_size": batch_size,
        "micro_batch_size": micro,
        "accumulate": batch_size // micro,
        "max_length": max_length,
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.config.vocab_size,
        "num_layers": len(model.layers),
        "frozen_layers": depth,
        "bottom": True,
        "far_config": None if far_config is None else far_config.to_dict(),
        "learners": {
            n: layer.mlp.learner_nodes.tolist() for n, layer in zip(ffn_names(model), model.layers, strict=True)
        },
        "base": base,
        "base_fingerprint": base["sha256"] or "",
        "lean_config": dataclasses.asdict(model.config),
        "optimizer": settings,
        "trainable": [tensor_spec(n, values[n].shape, "float32") for n in order],
    }
    initial = {n: values[n] for n in order}
    ids_spec = tensor_spec("input_ids", ids.shape, "int64")
    programs = {
        "train": (program, "none", [tensor_spec("hidden", hidden.shape, "float32"), ids_spec], ["loss", "hits"]),
        "bottom": (bottom_program, "all" if bottom_xnnpack else "none", [ids_spec], ["hidden"]),
    }
    if generate_length is not None:
        token, position = (tensor_spec(n, s, "int64") for n, s in zip(GENERATE_INPUTS, ((1, 1), (1,)), strict=True))
        programs["generate"] = (generate_program, "none", [token, position], ["logits"])
        manifest["generate"] = {
            "cache_length": generate_length,
            "trained_inputs": "after token and position, the trainable tensors in this manifest's order",
        }
    fields = {
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "packing": "texts packed into chunks of max_length tokens, no padding (far.data.texts)",
    }

    def write_texts(folder: Path) -> None:
        write_chunks(texts, folder / CHUNKS, manifest)
        manifest["text"] = {
            "file": CHUNKS,
            "sha256": sha256_file(folder / CHUNKS),
            "train_chunks": len(texts.train),
            "held_out_chunks": len(texts.validation),
        }

    write_tokenizer = lambda path: tokenizer.tokenizer.save(str(path))  # noqa: E731
    extra = None if texts is None else write_texts
    result = write_folder(out_dir, manifest, programs, write_tokenizer, fields, initial, seconds, extra)
    logger.info("lowered and wrote the programs in %s", ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    return result
