"""A lean GGUF causal LM's weights as a transformers model: the base that a PEFT adapter of its learners applies to.

The lean runtime (`far.llm.lean_model`) holds a GGUF file's weights dequantised, the matrices in its storage
dtype (bf16 unless the model was loaded in fp32) and the token embedding as the file's Q8_0 blocks. A learners
file changes those stored values, so the transformers base a PEFT adapter is exact for holds the same values:
`hf_state_dict` reads them under transformers' names (the inverse of `from_state_dict`'s naming; the tied LM head
is the embedding) and `hf_config` is the inverse of `far.llm.lean_config.from_hf_config`. Every value is kept in
fp32, which holds a bf16 value, and a Q8_0 value (an fp16 scale times an int8), exactly.

    >>> model, _ = far.models.load_lean_lm("smollm2-135m")
    >>> save_hf_base(model, "smollm2-135m-hf/")
    >>> base = transformers.AutoModelForCausalLM.from_pretrained("smollm2-135m-hf/")   # the lean model's logits
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

from far.llm.compact import CompactLinear, CompactWeight
from far.llm.lean_config import HF_FIELDS, SLIDING, LeanConfig
from far.llm.lean_learners import active_lean_learners, check_stock, value_key
from far.llm.lean_model import LeanCausalLM
from far.methods.peft_adapter import check_output_dir
from far.storage.atomic import atomic_dir

# What `save_hf_base` records beside the model: which GGUF file and storage dtype its values come from.
BASE_RECORD = "far_base.json"


def _transformers():
    # imported on use: `far generate`'s path (far.cli imports this module) stays clear of transformers (far.lazy)
    import transformers

    return transformers


def hf_config(config: LeanConfig):
    """The transformers `LlamaConfig` or `Gemma3TextConfig` whose model computes what the lean model computes."""
    transformers = _transformers()

    common = dict(
        **{hf: getattr(config, lean) for hf, lean in HF_FIELDS.items()},
        head_dim=config.head_dim,
        tie_word_embeddings=True,  # neither GGUF file has an output.weight: the head is the embedding
        attention_bias=False,
    )
    if not config.is_gemma:
        rope = {"rope_type": "default", "rope_theta": config.rope_theta}
        return transformers.LlamaConfig(**common, mlp_bias=False, rope_parameters=rope)
    scalar = config.query_scale**-2  # query_pre_attn_scalar ** -0.5 is the attention's scale
    return transformers.Gemma3TextConfig(
        **common,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": config.rope_local_theta},
        },
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window,
        query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar,
        hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )


def hf_value(weight: CompactWeight) -> Tensor:
    """A lean weight as stored (never perturbed), in fp32 and transformers' shape: a new tensor, not a view."""
    value = weight.stored.detach().to(torch.float32, copy=True)
    return value.reshape(-1) if value.dim() == 2 and value.shape[0] == 1 else value  # a norm's (1, hidden) row


@torch.no_grad()
def hf_state_dict(model: LeanCausalLM) -> dict[str, Tensor]:
    """Every weight the lean model reads, by transformers name, in fp32 (the tied `lm_head.weight` left out).

    Raises:
        ValueError: the model's FFNs are split (its node order is not the file's) or its bottom layers released.
    """
    if model.released_layers:
        raise ValueError(
            f"layers 0..{model.released_layers - 1} of this model were released (release_bottom); load the model "
            "again to read its weights"
        )
    if any(isinstance(m, CompactLinear) and len(m.parts) != 1 for m in model.modules()):
        raise ValueError(
            "this model's FFNs are split for training (their nodes reordered); read the weights of the stock model "
            "as far.models.load_lean_lm(name) returns it, with far.load_learners for a user's file"
        )
    vocab = torch.arange(model.config.vocab_size)
    state = {"model.embed_tokens.weight": model.embed_tokens.rows(vocab).float().contiguous()}  # (vocab, hidden)
    for name, module in model.named_modules():
        if isinstance(module, CompactWeight):
            state[f"model.{value_key(name)}"] = hf_value(module)
    return state


def hf_model(config: LeanConfig, state_dict: dict[str, Tensor]):
    """The transformers causal LM of `config` holding `state_dict`'s tensors (shared, not copied), fp32, eval mode."""
    transformers = _transformers()
    hf = hf_config(config)
    cls = transformers.Gemma3ForCausalLM if config.is_gemma else transformers.LlamaForCausalLM
    return cls.from_pretrained(None, config=hf, state_dict=state_dict, dtype=torch.float32).eval()


def base_record(model: LeanCausalLM) -> dict:
    """Which weights a base folder holds: the GGUF file (name, size, sha256) and the lean model's storage dtype."""
    if model.source is None:
        raise ValueError(
            "this lean model was not read from a GGUF file, so no base folder can name its weights; load it with "
            "far.models.load_lean_lm(name)"
        )
    # the matrices' storage: norms are kept in fp32 whatever the model's dtype (far.llm.lean_model)
    dtypes = {p.stored.dtype for m in model.modules() if isinstance(m, CompactLinear) for p in m.parts}
    return {
        "gguf_file": model.source.path.name,
        "gguf_bytes": model.source.size,
        "gguf_sha256": model.source.sha256(),
        "storage_dtype": str(dtypes.pop() if len(dtypes) == 1 else sorted(map(str, dtypes))).removeprefix("torch."),
    }


def read_base_record(folder: str | os.PathLike) -> dict | None:
    """The record `save_hf_base` left in `folder`, or None where there is none (or it is not JSON)."""
    try:
        return json.loads((Path(folder) / BASE_RECORD).read_text())
    except (OSError, ValueError):
        return None


def check_stock_base(model: LeanCausalLM) -> None:
    """ValueError unless `model` is the stock model as read from its GGUF file: not split, not training, and
    holding no learners file (a base, and what an adapter is measured against, are the stock weights)."""
    check_stock(model)
    if active_lean_learners(model) is not None:
        raise ValueError("this model holds a learners file; pass the stock model (far.unload_learners(model))")


def save_hf_base(model: LeanCausalLM, output_dir: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write the lean model's weights as a transformers model folder (config.json, model.safetensors), atomically.

    `transformers.AutoModelForCausalLM.from_pretrained(output_dir)` then gives the lean model's logits (fp32 compute
    on both sides), and is the base a PEFT adapter of a learners file of this model applies to
    (`far.methods.peft_lean.save_lean_peft_adapter`). The folder also holds `far_base.json`: the GGUF file and the
    storage dtype its values come from (a bf16 base and an fp32 one differ: their matrices are rounded differently).

    Args:
        model: The stock lean model (`far.models.load_lean_lm(name)`, in the dtype the learners files need).
        output_dir: The folder to write.
        overwrite: Replace an `output_dir` that holds files.

    Returns:
        The folder.

    Raises:
        ValueError: `output_dir` holds files (without `overwrite`), or `model` is not the stock model read from a
            GGUF file (split, training, or holding a learners file).
    """
    out = Path(output_dir)
    check_output_dir(out, overwrite)
    check_stock_base(model)
    record = base_record(model)
    hf = hf_model(model.config, hf_state_dict(model))
    with atomic_dir(out) as tmp:
        hf.save_pretrained(tmp)
        (tmp / BASE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out
