"""torch modules -> ExecuTorch programs: a training program (forward and backward in one graph) and a forward one.

The training recipe: `torch.export.export(strict=False)`, then `_export_forward_backward` (the
joint graph: the loss, each trainable tensor's gradient, and the trainable tensors themselves as
outputs), `to_edge` without the IR validity check (the joint graph holds ops outside the edge
dialect's list), the rewrite of `addmm` into `mm` + `add` (the wheel's kernels have an optimized
`mm` but only the portable `addmm`, about 4x slower on a BERT step), optionally XNNPACK, then
`to_executorch`.

XNNPACK on the joint graph works only op by op (`per_op_mode`: a whole partition fails on outputs
that pass inputs through), with the weights of fully connected ops taken as runtime inputs
(`force_non_static_weights_for_f32_linear`), so that updates to the trainable tensors reach the
delegates. Each delegate costs lowering time, so there are three levels (`XNNPACK_LEVELS`):
"none", "matmul" (the matrix products only: about half the step in a fifth of "all"'s lowering
time) and "all" (every operator XNNPACK takes: the fastest step, minutes to lower a 6-layer model;
docs/device.md has the numbers). The forward-only bottom is delegated to XNNPACK whole, which
lowers in seconds.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch import nn

INSTALL_HINT = (
    "install far's device extra (pip install -e '.[device]', which pins executorch==1.5.1), or use .venv-device, "
    "the environment bash .ci/setup makes with it (.venv-device/bin/far)"
)
XNNPACK_LEVELS = ("none", "matmul", "all")


@contextmanager
def quietly():
    """Run executorch's imports and passes without their side effects on logging.

    torchao (which executorch imports) logs a warning per CUDA kernel library it cannot load, which
    on a CPU-only machine says nothing about the export; and executorch calls `logging.basicConfig`
    (its XNNPACK partitioner on import, some passes through `logging.debug`), which would print
    every far message twice. Both are undone when the block ends.
    """
    torchao, root = logging.getLogger("torchao"), logging.getLogger()
    level, handlers, root_level = torchao.level, list(root.handlers), root.level
    torchao.setLevel(logging.ERROR)
    try:
        yield
    finally:
        torchao.setLevel(level)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(root_level)


def _exir():
    try:
        with quietly():
            import executorch.exir as exir
    except ImportError as error:
        raise ImportError(f"exporting to ExecuTorch needs executorch: {INSTALL_HINT}") from error
    return exir


def _xnnpack_partitioner(**options):
    try:
        with quietly():
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    except ImportError as error:
        raise ImportError(f"XNNPACK lowering needs executorch's XNNPACK backend and torchao: {INSTALL_HINT}") from error
    return XnnpackPartitioner(**options)


def _addmm_to_mm_add():
    """An edge pass: addmm(bias, a, b) -> add(mm(a, b), bias), with alpha = beta = 1 as export writes them."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    addmm, mm, add = (exir_ops.edge.aten.addmm.default, exir_ops.edge.aten.mm.default, exir_ops.edge.aten.add.Tensor)

    class AddmmToMmAdd(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == addmm and kwargs.get("beta", 1) == 1 and kwargs.get("alpha", 1) == 1:
                bias, a, b = args[:3]
                product = super().call_operator(mm, (a, b), {}, meta)
                return super().call_operator(add, (product, bias), {}, meta)
            return super().call_operator(op, args, kwargs, meta)

    return AddmmToMmAdd()


def _dense_empties(program) -> None:
    """Rewrite, in place, `empty_permuted` with the identity order (SiLU's backward makes one) as a plain `empty`:
    the same tensor, and an operator the runtime's kernels have."""
    graph = program.graph_module.graph
    for node in graph.nodes:
        if node.target == torch.ops.aten.empty_permuted.default and list(node.args[1]) == list(
            range(len(node.args[1]))
        ):
            node.target, node.args = torch.ops.aten.empty.memory_format, (node.args[0],)
    program.graph_module.recompile()


def _edge_config(exir):
    return exir.EdgeCompileConfig(_check_ir_validity=False)


def xnnpack_level(value: bool | str) -> str:
    """`value` as one of `XNNPACK_LEVELS` (True is "all", False "none"), or a ValueError naming them."""
    level = {True: "all", False: "none"}.get(value, value) if isinstance(value, bool) else value
    if level not in XNNPACK_LEVELS:
        raise ValueError(f"xnnpack must be True, False or one of {', '.join(XNNPACK_LEVELS)}, got {value!r}")
    return level


def _training_partitioner(level: str):
    options = {"per_op_mode": True, "force_non_static_weights_for_f32_linear": True}
    if level == "matmul":
        with quietly():
            from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig, LinearConfig, MMConfig

        options["configs"] = [MMConfig, LinearConfig, AddmmConfig]
    return _xnnpack_partitioner(**options)


def training_program(module: nn.Module, inputs: tuple, *, xnnpack: str = "none") -> tuple[object, list[str]]:
    """The ExecuTorch program (an `ExecutorchProgramManager`) that runs forward and backward of `module`,
    and the names of the trainable tensors in the program's order.

    Its method `forward` takes `inputs`' shapes and returns the user outputs (loss first), the
    gradients of the trainable tensors, then the trainable tensors; the meta-methods
    `__et_training_gradients_index_forward`, `__et_training_parameters_index_forward` and
    `__et_training_fqn_forward` say where each part starts and the tensors' names.
    """
    exir = _exir()
    from torch.export.experimental import _export_forward_backward

    exported = torch.export.export(module, inputs, strict=False)
    joint = _export_forward_backward(exported)
    _dense_empties(joint)
    specs = joint.graph_signature.output_specs
    names = [spec.target for spec in specs if spec.kind.name == "GRADIENT_TO_PARAMETER"]
    if xnnpack_level(xnnpack) != "none":
        partitioner = _training_partitioner(xnnpack_level(xnnpack))
        edge = exir.to_edge_transform_and_lower(joint, partitioner=[partitioner], compile_config=_edge_config(exir))
    else:
        edge = exir.to_edge(joint, compile_config=_edge_config(exir))
    edge = edge.transform([_addmm_to_mm_add()])
    return edge.to_executorch(), names


def forward_program(module: nn.Module, inputs: tuple, *, xnnpack: bool = True):
    """The ExecuTorch program of `module`'s forward pass (no gradients), delegated to XNNPACK if asked."""
    exir = _exir()
    with torch.no_grad():
        exported = torch.export.export(module.eval(), inputs, strict=False)
    if xnnpack:
        edge = exir.to_edge_transform_and_lower(exported, partitioner=[_xnnpack_partitioner()])
    else:
        edge = exir.to_edge(exported, compile_config=_edge_config(exir)).transform([_addmm_to_mm_add()])
    return edge.to_executorch()
