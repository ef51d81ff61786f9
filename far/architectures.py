"""Where the FFNs and attention blocks are: the one table of per-architecture knowledge, and discovery.

An FFN is a module (the *block*) that owns the projections at the relative names its `FFNSpec`
gives; node *i* is row *i* of each input projection (and its bias entry) plus column *i* of the
output projection. In an attention block a node is a head: its rows of the query, key and value
projections and its columns of the output projection. Under grouped-query attention a node is one
key/value head with its query heads, since splitting a group would pair query heads with the wrong
keys. Both are a `NodeGroup`, so surgery, saving and priming treat them alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from far.layers import PROJECTION_TYPES, SplitLinear, node_rows


@dataclass(frozen=True)
class FFNSpec:
    """Names of an FFN's projections, relative to the module that holds them.

    Args:
        inputs: Relative names of the input projections (two for gated MLPs: gate and up).
        output: Relative name of the output projection.

    Example:
        >>> FFNSpec(inputs=("mlp.fc_in",), output="mlp.fc_out")  # e.g. for GPT-J blocks
        FFNSpec(inputs=('mlp.fc_in',), output='mlp.fc_out')
    """

    inputs: tuple[str, ...]
    output: str

    def __post_init__(self) -> None:
        inputs = (self.inputs,) if isinstance(self.inputs, str) else tuple(self.inputs)
        object.__setattr__(self, "inputs", inputs)
        names = (*inputs, self.output)
        if not inputs or not all(isinstance(n, str) and n for n in names):
            raise ValueError(
                f"FFNSpec needs non-empty relative module names, got inputs={self.inputs!r}, "
                f"output={self.output!r}; e.g. FFNSpec(inputs=('intermediate.dense',), output='output.dense')"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"FFNSpec names must be distinct, got {names!r}")


@dataclass(frozen=True)
class AttentionSpec:
    """Names of an attention block's projections, relative to the module that holds them.

    Head counts come from the model's config (`num_attention_heads`, and `num_key_value_heads`
    for grouped-query attention) unless given here.

    Example:
        >>> AttentionSpec(query="attn.q", key="attn.k", value="attn.v", output="attn.o")
        AttentionSpec(query='attn.q', key='attn.k', value='attn.v', output='attn.o', n_heads=None, n_kv_heads=None)
    """

    query: str
    key: str
    value: str
    output: str
    n_heads: int | None = None
    n_kv_heads: int | None = None

    def __post_init__(self) -> None:
        names = (self.query, self.key, self.value, self.output)
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != 4:
            raise ValueError(
                f"AttentionSpec needs four distinct non-empty relative module names, got {names!r}; e.g. "
                "AttentionSpec(query='self_attn.q_proj', key='self_attn.k_proj', value='self_attn.v_proj', "
                "output='self_attn.o_proj')"
            )
        for field in ("n_heads", "n_kv_heads"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"AttentionSpec.{field} must be a positive int or None, got {value!r}")


_BERT_LIKE = FFNSpec(inputs=("intermediate.dense",), output="output.dense")
_GATED = FFNSpec(inputs=("mlp.gate_proj", "mlp.up_proj"), output="mlp.down_proj")

# The only place in the package that knows architectures by name.
BUILTIN_SPECS: dict[str, FFNSpec] = {
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "xlm-roberta": _BERT_LIKE,
    "electra": _BERT_LIKE,
    "mpnet": _BERT_LIKE,
    "distilbert": FFNSpec(inputs=("lin1",), output="lin2"),
    "gpt2": FFNSpec(inputs=("mlp.c_fc",), output="mlp.c_proj"),
    "opt": FFNSpec(inputs=("fc1",), output="fc2"),
    "llama": _GATED,
    "mistral": _GATED,
    "qwen2": _GATED,
    "gemma3_text": _GATED,  # Gemma-3's decoder as transformers loads it (e.g. from a GGUF file)
}
# The causal LMs among them: each token sees only those before it (no whole-sequence encoder estimates).
CAUSAL_LM_TYPES = frozenset({"gpt2", "opt", "llama", "mistral", "qwen2", "gemma3_text"})

_BERT_ATTENTION = AttentionSpec(
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    output="attention.output.dense",
)
_DECODER_ATTENTION = AttentionSpec(
    query="self_attn.q_proj", key="self_attn.k_proj", value="self_attn.v_proj", output="self_attn.o_proj"
)
# Attention layouts, and the architectures whose heads cannot be split, with the reason. A head
# split reorders heads (learners first), which is exact only where every head is computed alike
# from its own rows and columns.
BUILTIN_ATTENTION_SPECS: dict[str, AttentionSpec | str] = {
    "bert": _BERT_ATTENTION,
    "roberta": _BERT_ATTENTION,
    "xlm-roberta": _BERT_ATTENTION,
    "electra": _BERT_ATTENTION,
    "distilbert": AttentionSpec(
        query="attention.q_lin", key="attention.k_lin", value="attention.v_lin", output="attention.out_lin"
    ),
    "opt": AttentionSpec(
        query="self_attn.q_proj", key="self_attn.k_proj", value="self_attn.v_proj", output="self_attn.out_proj"
    ),
    "llama": _DECODER_ATTENTION,
    "mistral": _DECODER_ATTENTION,
    "qwen2": _DECODER_ATTENTION,
    # q_norm / k_norm normalise each head over head_dim with one weight shared by all heads: order-free
    "gemma3_text": _DECODER_ATTENTION,
    "gpt2": "GPT-2 computes query, key and value in one fused Conv1D (attn.c_attn), whose head rows cannot be "
    "split into one learner block and one frozen block",
    "mpnet": "MPNet adds a relative position bias per head, shared by all layers, which a per-layer reordering "
    "of heads would misalign",
}

# What feeds the first layer besides the embeddings (found by type), by the module's own (last) name:
# projections where the embedding width differs from the hidden size. Backward stops at a frozen
# stack of bottom layers only if they are frozen too.
BUILTIN_INPUT_MODULES: dict[str, tuple[str, ...]] = {
    "electra": ("embeddings_project",),
    "opt": ("project_in",),
}

_PROJECTION_TYPES = (*PROJECTION_TYPES, SplitLinear)


@dataclass(frozen=True)
class NodeGroup:
    """Projections that share nodes: an FFN (nodes: intermediate neurons) or an attention block (nodes: heads).

    `name` (the output projection's qualified name) is the group's key in scores and learner maps. A
    node is `width` consecutive rows of each projection, width = rows / `n_nodes` (1 in an FFN).
    """

    name: str
    inputs: tuple[str, ...]
    n_nodes: int
    kind: str = "ffn"  # or "attention"

    @property
    def output(self) -> str:
        return self.name

    @property
    def projections(self) -> tuple[str, ...]:
        return (*self.inputs, self.output)


FFN = NodeGroup  # an FFN is the group most code deals with


def check_model(model: object) -> nn.Module:
    """`model`, or a TypeError where it is not a torch module."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module (e.g. a transformers model), got {type(model).__name__}")
    return model


def projection_rows(module: nn.Module, role: str) -> int:
    """How many node rows a projection has: outputs of an input projection, inputs of the output one."""
    if isinstance(module, SplitLinear):
        return module.n_nodes
    return node_rows(module, role).shape[0]


def expand_nodes(nodes: Tensor, width: int) -> Tensor:
    """Node indices -> the row indices they cover, `width` consecutive rows each, in order."""
    if width == 1:
        return nodes
    return (nodes.unsqueeze(1) * width + torch.arange(width, device=nodes.device)).reshape(-1)


def model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


def input_modules(model: nn.Module) -> tuple[str, ...]:
    """Names (a module's own, last name) of what feeds the first layer besides the embeddings."""
    return BUILTIN_INPUT_MODULES.get(model_type(model), ())


def resolve_spec(model: nn.Module, spec: FFNSpec | None = None) -> FFNSpec:
    """The caller's spec if given, else the built-in one for `model.config.model_type`."""
    if spec is not None:
        if not isinstance(spec, FFNSpec):
            raise TypeError(f"spec must be a far.FFNSpec, got {type(spec).__name__}")
        return spec
    kind = model_type(model)
    if kind in BUILTIN_SPECS:
        return BUILTIN_SPECS[kind]
    raise ValueError(
        f"far has no built-in FFN layout for model_type {kind!r} (built in: "
        f"{', '.join(sorted(BUILTIN_SPECS))}). Name the FFN projections yourself, relative to the "
        "module that holds them, e.g. spec=far.FFNSpec(inputs=('mlp.fc_in',), output='mlp.fc_out')"
    )


def _projection_sets(model: nn.Module, relative: tuple[str, ...]) -> Iterator[tuple[str, list[str], list[nn.Module]]]:
    """(block name, qualified names, modules) of every module that holds a projection at each `relative` name."""
    modules: Mapping[str, nn.Module] = dict(model.named_modules())
    for block_name in modules:
        prefix = f"{block_name}." if block_name else ""
        names = [prefix + n for n in relative]
        parts = [modules.get(n) for n in names]
        if all(isinstance(p, _PROJECTION_TYPES) for p in parts):
            yield block_name, names, parts


def find_ffns(model: nn.Module, spec: FFNSpec | None = None) -> dict[str, FFN]:
    """Every FFN of `model`, keyed by the qualified name of its output projection.

    Args:
        model: A Hugging Face (or any) `nn.Module`, plain or reconfigured by FAR.
        spec: Where the projections are, for architectures that are not built in.

    Returns:
        `{output_projection_name: FFN}` in module order.

    Raises:
        TypeError: `model` is not an `nn.Module`.
        ValueError: the architecture is unknown and no spec was given, or no FFN matches.

    Example:
        >>> ffns = far.find_ffns(model)
        >>> ffns["bert.encoder.layer.0.output.dense"].n_nodes
        1536
    """
    spec = resolve_spec(check_model(model), spec)
    ffns: dict[str, FFN] = {}
    for block_name, names, parts in _projection_sets(model, (*spec.inputs, spec.output)):
        *input_names, output_name = names
        counts = {projection_rows(m, "input") for m in parts[:-1]} | {projection_rows(parts[-1], "output")}
        if len(counts) != 1:
            raise ValueError(
                f"the FFN at {block_name!r} has projections of different node counts {sorted(counts)}; "
                "check that the spec names its input and output projections"
            )
        ffns[output_name] = FFN(name=output_name, inputs=tuple(input_names), n_nodes=counts.pop())
    if not ffns:
        raise ValueError(
            f"no FFN in {type(model).__name__} matches {spec}; pass spec=far.FFNSpec(...) naming the "
            "input and output projections (nn.Linear or Conv1D) relative to their common parent module"
        )
    return ffns


def resolve_attention_spec(model: nn.Module, spec: AttentionSpec | None = None) -> AttentionSpec:
    """The caller's attention spec if given, else the built-in one; a clear error where heads cannot be split."""
    if spec is not None:
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"attention_spec must be a far.AttentionSpec, got {type(spec).__name__}")
        return spec
    kind = model_type(model)
    found = BUILTIN_ATTENTION_SPECS.get(kind)
    if isinstance(found, str):
        raise ValueError(
            f"far cannot split the attention heads of {kind!r} models: {found}. Leave attention_retention unset"
        )
    if found is None:
        supported = sorted(k for k, v in BUILTIN_ATTENTION_SPECS.items() if isinstance(v, AttentionSpec))
        raise ValueError(
            f"far has no built-in attention layout for model_type {kind!r} (built in: {', '.join(supported)}). "
            "Name the projections yourself, e.g. attention_spec=far.AttentionSpec(query='self_attn.q_proj', "
            "key='self_attn.k_proj', value='self_attn.v_proj', output='self_attn.o_proj'), or leave "
            "attention_retention unset"
        )
    return found


def _head_counts(model: nn.Module, spec: AttentionSpec) -> tuple[int, int]:
    config = getattr(model, "config", None)
    heads = spec.n_heads or getattr(config, "num_attention_heads", None)
    kv_heads = spec.n_kv_heads or getattr(config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads < 1 or heads % kv_heads:
        raise ValueError(
            f"cannot tell the head counts of this model (num_attention_heads={heads!r}, "
            f"num_key_value_heads={kv_heads!r}); give them as AttentionSpec(..., n_heads=..., n_kv_heads=...)"
        )
    return heads, kv_heads


def find_attention(model: nn.Module, spec: AttentionSpec | None = None) -> dict[str, NodeGroup]:
    """Every attention block of `model`, as node groups whose nodes are heads (key/value groups under GQA).

    Args:
        model: A plain model, or one whose heads FAR has split.
        spec: Where the projections are, for architectures that are not built in.

    Returns:
        `{output_projection_name: NodeGroup(kind="attention")}` in module order; `n_nodes` is the
        number of key/value heads (equal to the number of heads without grouped-query attention).

    Raises:
        ValueError: the architecture's heads cannot be split (fused QKV, per-head position
            biases), it is unknown and no spec was given, or the shapes disagree with the head counts.

    Example:
        >>> far.find_attention(bert)["bert.encoder.layer.0.attention.output.dense"].n_nodes
        12
    """
    spec = resolve_attention_spec(check_model(model), spec)
    heads, kv_heads = _head_counts(model, spec)
    blocks: dict[str, NodeGroup] = {}
    for block_name, names, parts in _projection_sets(model, (spec.query, spec.key, spec.value, spec.output)):
        q_rows, k_rows, v_rows = (projection_rows(m, "input") for m in parts[:3])
        o_rows = projection_rows(parts[3], "output")
        if q_rows % heads or k_rows != v_rows or k_rows * heads != q_rows * kv_heads or o_rows != q_rows:
            raise ValueError(
                f"the attention block at {block_name!r} has query/key/value/output sizes {q_rows}/{k_rows}/"
                f"{v_rows}/{o_rows}, which do not fit {heads} heads and {kv_heads} key/value heads; check the "
                "spec and the model's config"
            )
        blocks[names[3]] = NodeGroup(name=names[3], inputs=tuple(names[:3]), n_nodes=kv_heads, kind="attention")
    if not blocks:
        raise ValueError(
            f"no attention block in {type(model).__name__} matches {spec}; pass attention_spec=far.AttentionSpec(...) "
            "naming the query, key, value and output projections relative to their common parent module"
        )
    return blocks
