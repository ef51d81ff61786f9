"""Recomputation in a joint forward-backward graph: what backward reads is computed again there rather than
kept alive from forward, so ExecuTorch's memory planner holds one layer's activations at a time.

`_export_forward_backward` gives one graph, forward then backward, and ExecuTorch plans its memory by
each value's lifetime in that order: every activation backward reads, and every weight read into fp32 (a
bf16 matrix, a transpose, a dequantised slice), stays planned from forward to backward. Two rewrites, each
running the same operators on the same values (so the results do not change, bit for bit):

- `recompute_weight_values`: a value computed from the weights alone is computed right before each
  operator that reads it (the conversions cost little next to the products they feed).
- `recompute_segments`: the residual stream's values (each block's input, `h` in `h + block(h)`) are kept;
  what backward reads of a block is computed again from its input just before backward first reads it,
  as the lean runtime recomputes each layer (`far.llm.backprop`). The stream is found in the graph: from
  the first user input, each `add(r, f(r))` of the forward is the next residual value. What follows the last
  one (the final norm and the loss, whose vocabulary scan is the costliest part) is kept as it is.

    >>> joint = _export_forward_backward(torch.export.export(module, inputs))
    >>> recompute_in_backward(joint)
"""

from __future__ import annotations

import torch
from torch import fx

_ADD = torch.ops.aten.add.Tensor


def _pure(node: fx.Node) -> bool:
    """An operator that gives the same value again from the same inputs and changes none of them."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return node.op == "call_function" and target.__name__ == "getitem"
    return torch.Tag.nondeterministic_seeded not in target.tags and not target._schema.is_mutable


def _forward(program) -> set[fx.Node]:
    """The nodes the user outputs (the loss, ...) depend on: the forward part of the joint graph."""
    names = set(program.graph_signature.user_outputs)
    output = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    todo = [n for n in output.all_input_nodes if n.name in names]
    seen: set[fx.Node] = set()
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return seen


def _copier(graph: fx.Graph, before: fx.Node, again_if) -> callable:
    """`again(node)`: a copy of `node` inserted before `before`, its inputs copied too where `again_if` says."""
    copies: dict[fx.Node, fx.Node] = {}

    def again(node: fx.Node) -> fx.Node:
        if not again_if(node):
            return node
        if node not in copies:
            with graph.inserting_before(before):
                copies[node] = graph.node_copy(node, again)
        return copies[node]

    return again


def recompute_weight_values(program) -> None:
    """Rewrite `program`'s graph in place: each value computed from its weights and constants alone (no user
    input) is computed again, from the weights, right before each operator that reads it; the first
    computations, which nothing reads any more, are removed.
    """
    graph = program.graph_module.graph
    inputs = set(program.graph_signature.user_inputs)
    weights: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" and node.name not in inputs:
            weights.add(node)
        elif _pure(node) and all(n in weights for n in node.all_input_nodes):
            weights.add(node)
    computed = lambda n: n in weights and n.op != "placeholder"  # noqa: E731
    for user in list(graph.nodes):
        if user.op == "call_function" and user not in weights:
            again = _copier(graph, user, computed)
            for node in user.all_input_nodes:
                if computed(node):
                    user.replace_input_with(node, again(node))
    for node in reversed(list(graph.nodes)):
        if computed(node) and not node.users:
            graph.erase_node(node)


def _residual_stream(program, forward: set[fx.Node]) -> list[fx.Node]:
    """The forward's residual values: the first user input, then each `add(r, f(r))` of the last one found."""
    first = next(n for n in program.graph_module.graph.nodes if n.name == program.graph_signature.user_inputs[0])
    stream = [first]
    while True:
        r = stream[-1]
        below: set[fx.Node] = set()
        todo = [u for u in r.users if u in forward]
        while todo:
            node = todo.pop()
            if node not in below:
                below.add(node)
                todo.extend(u for u in node.users if u in forward)
        nxt = [
            u
            for u in r.users
            if u in forward and u.target == _ADD and any(a in below for a in u.args if isinstance(a, fx.Node))
        ]
        if not nxt:
            return stream
        stream.append(nxt[0])  # users in the order they were traced: the first such add


def recompute_segments(program) -> None:
    """Rewrite `program`'s graph in place: what backward reads of each residual block's forward is computed
    again from the block's input before backward first reads it (module docstring).

    The forward part ends at the last node the user outputs depend on; what lies before it belongs to it,
    including the aliases of activations the joint graph places there for backward.
    """
    graph = program.graph_module.graph
    forward = _forward(program)
    stream = _residual_stream(program, forward)
    position = {node: i for i, node in enumerate(stream)}
    nodes = list(graph.nodes)
    end = max(i for i, node in enumerate(nodes) if node in forward)
    segment: dict[fx.Node, int] = {}  # a forward node's block: the last residual value it depends on
    for node in nodes[: end + 1]:
        if node in position:
            segment[node] = position[node]
        else:
            segment[node] = max((segment.get(n, -1) for n in node.all_input_nodes), default=-1)
    last = len(stream) - 1  # the final norm and the loss: kept

    def in_block(node: fx.Node) -> int:
        if node not in segment or node in position or not _pure(node):
            return -1
        return segment[node] if segment[node] < last else -1

    copiers: dict[int, callable] = {}
    for user in nodes[end + 1 :]:
        if user.op != "call_function":
            continue
        for node in user.all_input_nodes:
            block = in_block(node)
            if block < 0:
                continue
            if block not in copiers:  # before the first backward reader of this block
                copiers[block] = _copier(graph, user, lambda n, b=block: in_block(n) == b)
            user.replace_input_with(node, copiers[block](node))


def recompute_in_backward(program) -> None:
    """Both rewrites (module docstring) on `program`, a joint forward-backward ExportedProgram, in place."""
    recompute_segments(program)
    recompute_weight_values(program)
    program.graph_module.graph.lint()
    program.graph_module.recompile()
