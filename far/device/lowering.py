"""torch modules -> ExecuTorch programs: a training program (forward and backward in one graph) and a forward one.

Training: `torch.export.export(strict=False)`, `_export_forward_backward` (the joint graph: loss,
gradients, trainable tensors as outputs), `to_edge` without the IR validity check (the joint graph holds
ops outside the edge dialect), `addmm` rewritten as `mm` + `add` (the wheel has an optimized `mm` but only
the portable `addmm`, about 4x slower on a BERT step), `mm` of a transposed weight as `linear` and a transpose
of a transpose as the tensor itself (ExecuTorch's transposes are copies), optionally XNNPACK, `to_executorch`.

XNNPACK on the joint graph works only op by op (`per_op_mode`: a whole partition fails on outputs that
pass inputs through), with linear weights as runtime inputs (`force_non_static_weights_for_f32_linear`)
so that updates reach the delegates. `XNNPACK_LEVELS`: "none", "matmul" (the products delegated, a fifth
of "all"'s lowering time; far_train's own kernels multiply as fast without the delegates' memory) and "all"
(the fastest step, minutes to lower; docs/device.md). The forward-only bottom is delegated whole, in seconds.
"""

from __future__ import annotations

import logging
import time
import warnings
from contextlib import contextmanager

import torch
from torch import nn

from far.device.recompute import recompute_in_backward

INSTALL_HINT = (
    "install far's device extra (pip install -e '.[device]', which pins executorch==1.5.1), or use .venv-device, "
    "the environment bash .ci/setup makes with it (.venv-device/bin/far)"
)
XNNPACK_LEVELS = ("none", "matmul", "all")


@contextmanager
def quietly():
    """Run executorch's imports and passes without their side effects on logging, undone at the end: torchao
    warns of every CUDA kernel library it cannot load, and executorch calls `logging.basicConfig`, which
    would print every far message twice.
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


def _fewer_transposes(graph_module):
    """An edge pass: mm(a, permute_copy(w, [1, 0])) -> linear(a, w), and a transpose of a transpose -> the
    tensor itself. ExecuTorch's permute_copy writes each transposed weight out before its product (a fifth of a
    causal LM's step, measured by experiments/device_train.py's lm-step part), and backward transposes the
    forward's transposed weight back; its optimized `linear` reads `w` as it lies.
    """
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import PassResult

    mm, permute, linear = (
        exir_ops.edge.aten.mm.default,
        exir_ops.edge.aten.permute_copy.default,
        exir_ops.edge.aten.linear.default,
    )

    def transpose_of(node):
        """What `node` transposes (a permute_copy of [1, 0]), else None."""
        if getattr(node, "op", None) == "call_function" and node.target == permute and list(node.args[1]) == [1, 0]:
            return node.args[0]
        return None

    graph, changed = graph_module.graph, False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target == mm and transpose_of(node.args[1]) is not None:
            a, b = node.args
            with graph.inserting_before(node):
                product = graph.call_function(linear, (a, transpose_of(b)))
            product.meta = dict(node.meta)
            node.replace_all_uses_with(product)
            graph.erase_node(node)
        elif transpose_of(node) is not None and transpose_of(transpose_of(node)) is not None:
            inner = transpose_of(transpose_of(node))
            returned = lambda n: any(user.op == "output" for user in n.users)  # noqa: E731
            if returned(node) and (inner.op != "call_function" or returned(inner)):
                continue  # an output that would alias an input or another output: kept as its own tensor
            node.replace_all_uses_with(inner)
            graph.erase_node(node)
        else:
            continue
        changed = True
    for node in reversed(list(graph.nodes)):  # the transposes nothing reads any more
        if transpose_of(node) is not None and not node.users:
            graph.erase_node(node)
    graph_module.recompile()
    return PassResult(graph_module, changed)


def _dense_empties(program) -> None:
    """Rewrite, in place, an identity-order `empty_permuted` (SiLU's backward makes one) as `empty`: the same
    tensor, and an operator the runtime's kernels have.
    """
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


def training_program(
    module: nn.Module, inputs: tuple, *, xnnpack: str = "none", recompute: bool = False
) -> tuple[object, list[str]]:
    """The ExecuTorch program running forward and backward of `module`, and the trainable tensors' names in
    the program's order. `forward` returns the user outputs (loss first), the gradients, then the trainable
    tensors; the `__et_training_*_forward` meta-methods say where each part starts and the names. With
    `recompute`, backward computes again what it reads of each residual block and of the weights' fp32
    reads instead of keeping them from forward (`far.device.recompute`).
    """
    exir = _exir()
    from torch.export.experimental import _export_forward_backward

    exported = torch.export.export(module, inputs, strict=False)
    joint = _export_forward_backward(exported)
    _dense_empties(joint)
    if recompute:
        recompute_in_backward(joint)
    specs = joint.graph_signature.output_specs
    names = [spec.target for spec in specs if spec.kind.name == "GRADIENT_TO_PARAMETER"]
    if xnnpack_level(xnnpack) != "none":
        partitioner = _training_partitioner(xnnpack_level(xnnpack))
        edge = exir.to_edge_transform_and_lower(joint, partitioner=[partitioner], compile_config=_edge_config(exir))
    else:
        edge = exir.to_edge(joint, compile_config=_edge_config(exir))
    edge = edge.transform([_addmm_to_mm_add(), _fewer_transposes])
    return edge.to_executorch(), names


def forward_program(
    module: nn.Module,
    inputs: tuple,
    *,
    xnnpack: bool = True,
    planned_inputs: bool = True,
    initialized_buffers: tuple[str, ...] = (),
):
    """The ExecuTorch program of `module`'s forward pass (no gradients), delegated to XNNPACK if asked. Without
    `planned_inputs`, the runtime reads each input where the caller keeps it (no copy into planned memory).
    Buffers the program updates in place start from their values at export where their graph names contain one of
    `initialized_buffers` (ExecuTorch otherwise serializes only their shape: memory as the runtime finds it).
    """
    exir = _exir()
    with torch.no_grad():
        exported = torch.export.export(module.eval(), inputs, strict=False)
    if xnnpack:
        edge = exir.to_edge_transform_and_lower(exported, partitioner=[_xnnpack_partitioner()])
    else:
        edge = exir.to_edge(exported, compile_config=_edge_config(exir)).transform([_addmm_to_mm_add()])
    if planned_inputs and not initialized_buffers:
        return edge.to_executorch()
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    planning = MemoryPlanningPass(alloc_graph_input=planned_inputs)
    passes = [InitializedMutableBufferPass(list(initialized_buffers))]
    return edge.to_executorch(exir.ExecutorchBackendConfig(passes=passes, memory_planning_pass=planning))


def lower_views(
    top: nn.Module,
    train_inputs: tuple,
    bottom: nn.Module | None,
    bottom_inputs: tuple | None,
    *,
    xnnpack: str,
    bottom_xnnpack: bool,
    recompute: bool = False,
) -> tuple[object, list[str], object | None, dict[str, float]]:
    """`training_program(top)`, `forward_program(bottom)` (None without a bottom) and the seconds each took."""
    seconds: dict[str, float] = {}
    bottom_program = None
    start = time.perf_counter()
    with quietly(), warnings.catch_warnings():  # torch.export's and executorch's notes on their own internals
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        program, order = training_program(top, train_inputs, xnnpack=xnnpack, recompute=recompute)
        seconds["train"] = time.perf_counter() - start
        if bottom is not None:
            start = time.perf_counter()
            bottom_program = forward_program(bottom, bottom_inputs, xnnpack=bottom_xnnpack)
            seconds["bottom"] = time.perf_counter() - start
    return program, order, bottom_program, seconds
