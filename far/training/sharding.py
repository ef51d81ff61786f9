"""FSDP2 for the encoder runs: each process holds a share of every tensor, and the run turns the model back into a
plain one wherever it needs whole tensors.

`shard_` applies `torch.distributed.fsdp.fully_shard` to each transformer layer, then to the model (the
embeddings and the head): a layer's tensors are gathered for its forward and backward only. FSDP2 shards each
parameter on its own, so FAR's learner and frozen tensors (separate parameters after the surgery) are sharded
alike, the frozen ones simply get no gradient. `gather_` is the way back: every tensor gathered whole into the
model's own modules, FSDP's classes, hooks and state taken off, so that the surgery, a checkpoint and the saved
model see the plain model that a one-process run has. FSDP2 has no public inverse of `fully_shard`; `gather_`
undoes what torch 2.13's `fully_shard` attaches (tests/test_finetune_fsdp.py checks it on every run).

An optimizer follows the model both ways: its tensors and its state (AdamW's moments) are sharded and gathered
with the parameters they belong to, so a checkpoint holds whole moments whatever the number of processes.

Every function here is collective: each process calls it, in the same order.

    >>> shard_(model, find_layers(model), optimizer)   # before the steps
    >>> gather_(model, optimizer)                      # whole tensors again: surgery, checkpoint, saving
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn
from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
from torch.distributed._composable_state import _module_state_mapping


def _torch() -> tuple[types.ModuleType, types.ModuleType]:
    """torch's FSDP2 and DTensor modules, imported on first use: they bring sympy with them (as torch._dynamo does,
    docs/design.md "Resident memory"), which a run that does not shard does not pay for."""
    import torch.distributed.fsdp as fsdp
    import torch.distributed.tensor as dtensor

    return fsdp, dtensor


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is sharded by `fully_shard` (FSDP2)."""
    # A sharded model means FSDP2 was imported: a run that never shards does not import it to ask.
    return "torch.distributed.fsdp" in sys.modules and isinstance(model, _torch()[0].FSDPModule)


def shard_(model: nn.Module, layers: Sequence[str], optimizer: Any = None) -> nn.Module:
    """Shard `model` in place over the process group: each of `layers` (qualified names) a unit of its own, the
    rest (embeddings, head) the model's; `optimizer`'s tensors and state follow. Returns `model`."""
    fully_shard = _torch()[0].fully_shard
    before = _parameters_by_name(model)
    for name in layers:
        fully_shard(model.get_submodule(name))
    fully_shard(model)
    if optimizer is not None:
        after = _parameters_by_name(model)
        _move_optimizer(optimizer, {id(p): after[name] for name, p in before.items()}, _to_shard)
    return model


def gather_(model: nn.Module, optimizer: Any = None) -> nn.Module:
    """Turn a model that `shard_` sharded back into a plain one, in place: every parameter whole, in the module
    that held it, with its `requires_grad`; tied tensors stay tied. `optimizer`'s tensors and state follow.
    Returns `model`. A model that is not sharded is left as it is."""
    if not is_sharded(model):
        return model
    (fsdp, dtensor), whole = _torch(), {}  # whole: by the sharded parameter, so a tied one is gathered once
    units = [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]
    for unit in units:
        unit.reshard()  # the registered tensors are the sharded ones (the root stays gathered after a forward)
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if isinstance(p, dtensor.DTensor):
                if id(p) not in whole:
                    whole[id(p)] = nn.Parameter(p.full_tensor(), requires_grad=p.requires_grad)
                module._parameters[name] = whole[id(p)]
    for unit in units:
        _detach(unit)
    for module in model.modules():
        rejoin = getattr(module, "rejoin_", None)  # FAR's SplitLinear: learner and frozen parts in one storage
        if rejoin is not None:
            rejoin()
    for module in model.modules():
        for attribute in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            module.__dict__.pop(attribute, None)
    if optimizer is not None:
        _move_optimizer(optimizer, whole, _to_whole)
    return model


def _detach(unit: nn.Module) -> None:
    """Take off what `fully_shard` attached to `unit`: its hooks, its state and its class."""
    state = unit._get_fsdp_state()
    handles = [state._pre_forward_hook_handle, state._post_forward_hook_handle]
    for group in state._fsdp_param_groups:
        handles += group._module_to_pre_save_state_dict_hook_handle.values()
        handles += group._module_to_pre_load_state_dict_hook_handle.values()
        handles += [fsdp_param._post_load_hook_handle for fsdp_param in group.fsdp_params]
    for handle in handles:
        if handle is not None:
            handle.remove()
    _module_state_mapping.pop(unit, None)
    unit.__dict__.pop(STATE_KEY, None)
    unit.__dict__.pop(REGISTRY_KEY, None)
    # fully_shard made the class `FSDP<Class>(FSDPModule, Class)`: the model's own class is the last base.
    unit.__class__ = type(unit).__bases__[-1]


def _parameters_by_name(model: nn.Module) -> dict[str, Tensor]:
    return dict(model.named_parameters())


def _to_shard(value: Tensor, param: Tensor) -> Tensor:
    """An optimizer's state tensor of `param`'s whole shape, sharded as `param` is (a step counter stays)."""
    dtensor = _torch()[1]
    if not isinstance(param, dtensor.DTensor) or isinstance(value, dtensor.DTensor):
        return value
    if value.shape != param.shape or not value.dim():
        return value
    # Every process holds the same whole value: each keeps its own share, nothing is sent.
    return dtensor.distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


def _to_whole(value: Tensor, _: Tensor) -> Tensor:
    """An optimizer's state tensor gathered whole (a sharded moment), or as it is (a step counter)."""
    return value.full_tensor() if isinstance(value, _torch()[1].DTensor) else value


def _move_optimizer(optimizer: Any, new: dict[int, Tensor], convert: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Point `optimizer` at the new tensors (`new[id(old)]`) and convert its state to them."""
    moved = {}
    for p, entry in optimizer.state.items():
        q = new[id(p)]
        moved[q] = {key: convert(value, q) if isinstance(value, Tensor) else value for key, value in entry.items()}
    for group in optimizer.param_groups:
        group["params"] = [new[id(p)] for p in group["params"]]
    optimizer.state.clear()  # the same mapping object: torch's optimizers keep a defaultdict
    optimizer.state.update(moved)
