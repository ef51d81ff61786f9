"""Where the FFNs are: the one table of per-architecture knowledge, and FFN discovery.

An FFN is found as a module (the *block*) that owns the input projection(s) and the output
projection at the relative names its `FFNSpec` gives. Node *i* of an FFN is row *i* of each input
projection (and its bias entry) plus column *i* of the output projection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

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
}

_PROJECTION_TYPES = (*PROJECTION_TYPES, SplitLinear)


@dataclass(frozen=True)
class FFN:
    """One FFN of a model, named by qualified module names.

    `name` (the output projection's qualified name) is the FFN's key in scores and learner maps.
    """

    name: str
    inputs: tuple[str, ...]
    n_nodes: int

    @property
    def output(self) -> str:
        return self.name


def model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


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


def _node_count(module: nn.Module, role: str) -> int:
    """Nodes of a projection: its outputs for an input projection, its inputs for the output one."""
    if isinstance(module, SplitLinear):
        return module.n_nodes
    return node_rows(module, role).shape[0]


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
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module (e.g. a transformers model), got {type(model).__name__}")
    spec = resolve_spec(model, spec)
    modules: Mapping[str, nn.Module] = dict(model.named_modules())
    ffns: dict[str, FFN] = {}
    for block_name in modules:
        prefix = f"{block_name}." if block_name else ""
        names = [prefix + n for n in (*spec.inputs, spec.output)]
        parts = [modules.get(n) for n in names]
        if not all(isinstance(p, _PROJECTION_TYPES) for p in parts):
            continue
        *input_names, output_name = names
        counts = {_node_count(m, "input") for m in parts[:-1]} | {_node_count(parts[-1], "output")}
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
