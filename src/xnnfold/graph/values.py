"""Which nodes of a graph hold the same value (:class:`ValueNumbers`), and which placeholders a
graph writes in place (:func:`written_placeholders`): what the KV-cache step's proofs read
(every layer's copy of the cache position is one value) and what the attention step merges
(a mask prepared once per mask, not once per layer: :func:`merge_repeats`)."""

from __future__ import annotations

import torch
import torch.fx
from torch.export import ExportedProgram

from .node_meta import tensor_val

aten = torch.ops.aten


def same_size(a, b) -> bool:
    """Whether two sizes are one: equal ints, or SymInts of one expression (never a guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


def at_least_one(size) -> bool:
    """Whether a size (an int, or a SymInt by its ShapeEnv's range) is at least 1."""
    if isinstance(size, int):
        return size >= 1
    node = size.node
    try:
        return bool(node.shape_env.bound_sympy(node.expr).lower >= 1)
    except Exception:  # noqa: BLE001 - a range that cannot be read: not known to be >= 1
        return False


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def written_placeholders(program: ExportedProgram) -> dict:
    """{placeholder: [nodes writing into it in place]} (an op whose schema marks the argument
    ``Tensor(a!)``, given the placeholder itself)."""
    writes: dict = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for argument, given in zip(node.target._schema.arguments, node.args):
            if argument.alias_info is not None and argument.alias_info.is_write and \
                    isinstance(given, torch.fx.Node) and given.op == "placeholder":
                writes.setdefault(given, []).append(node)
    return writes


# Ops whose value is their first input's when dtype and shape are kept (a copy, a cast to the
# same dtype).
_SAME_VALUE = (aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default,
               aten.clone.default, aten.alias.default, aten.detach.default)


class ValueNumbers:
    """Which nodes of a graph hold the same value: a node is numbered as the first node of the
    same op on the same (numbered) arguments, and a same-dtype, same-shape cast or copy — and
    ``copy_(buffer, x)``, whose value is ``x`` — as its source. transformers copies
    ``cache_position[0]`` into each layer's ``cumulative_length`` buffer and reads it back with
    ``.to(int64)``: every layer has start nodes of its own, all one value."""

    def __init__(self, graph: torch.fx.Graph, written: set):
        self.number: dict = {}
        self._written = written    # placeholders written in place: a read of one is its own
        seen: dict = {}
        for node in graph.nodes:
            self.number[node] = self._number(node, seen)

    def _number(self, node, seen) -> torch.fx.Node:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return node
        source = None
        if node.target is aten.copy_.default and isinstance(node.args[1], torch.fx.Node):
            source = node.args[1]          # its value is what it copies, whatever it writes
        elif any(i in self._written for i in node.all_input_nodes):
            return node
        elif node.target in _SAME_VALUE and isinstance(node.args[0], torch.fx.Node):
            source = node.args[0]
        if source is not None:
            a, b = tensor_val(node), tensor_val(source)
            if a is not None and b is not None and a.dtype == b.dtype and \
                    same_shape(a.shape, b.shape):
                return self.number[source]
        if node.target._schema.is_mutable:
            return node
        try:
            key = (node.target, _key(node.args, self.number), _key(node.kwargs, self.number))
            hash(key)
        except TypeError:
            return node
        return seen.setdefault(key, node)

    def __call__(self, node: torch.fx.Node) -> torch.fx.Node:
        return self.number.get(node, node)


def _key(value, number):
    if isinstance(value, torch.fx.Node):
        return ("node", number[value])
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, number) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v, number)) for k, v in value.items()))
    return value


def merge_repeats(graph: torch.fx.Graph, created: set, targets: frozenset) -> int:
    """Merge each node of ``created`` whose target is one of ``targets`` (pure ops) into the
    first node of the graph holding the same value (:class:`ValueNumbers`: the same op on the
    same values); return how many nodes went. The first comes earlier in the graph, so before
    every user of the merged one."""
    written = {n for n in graph.nodes if n.op == "placeholder"} & \
        {a for n in graph.nodes if n.op == "call_function" and
         isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
         for a in n.all_input_nodes}
    numbers, merged = ValueNumbers(graph, written), 0
    for node in list(graph.nodes):
        if node not in created or node.target not in targets:
            continue
        same = numbers(node)
        if same is not node:
            node.replace_all_uses_with(same)
            graph.erase_node(node)
            merged += 1
    return merged
