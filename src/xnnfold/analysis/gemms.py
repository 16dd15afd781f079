"""Which ATen ops are GEMMs, and where their weight and bias sit in the arguments.

The table is written against the program that ``transform_for_pre_decomposition`` receives:
an ATen program straight out of ``torch.export.export`` (training IR), where ``linear``,
``conv1d`` / ``conv2d`` and ``matmul`` are still whole, and against the same program after
``run_decompositions`` (``addmm``, ``mm``, ``convolution``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx

aten = torch.ops.aten


@dataclass(frozen=True)
class GemmSpec:
    """Where a GEMM op keeps its operands. ``kind`` is the family explain() reports."""

    kind: str
    act: int
    weight: int
    bias: Optional[int]


_LINEAR = GemmSpec("linear", act=0, weight=1, bias=2)
_CONV = GemmSpec("convolution", act=0, weight=1, bias=2)

GEMM_SPECS: dict = {
    aten.linear.default: _LINEAR,
    aten.addmm.default: GemmSpec("addmm", act=1, weight=2, bias=0),
    aten.mm.default: GemmSpec("mm", act=0, weight=1, bias=None),
    # x @ W with a 2-D static W becomes mm (or a view + mm) once decomposed.
    aten.matmul.default: GemmSpec("mm", act=0, weight=1, bias=None),
    aten.convolution.default: _CONV,
    aten._convolution.default: _CONV,
    aten.conv1d.default: _CONV,
    aten.conv2d.default: _CONV,
    aten.conv3d.default: _CONV,
    aten.conv1d.padding: _CONV,
    aten.conv2d.padding: _CONV,
    aten.conv3d.padding: _CONV,
    aten.conv_transpose1d.default: _CONV,
    aten.conv_transpose2d.input: _CONV,
    aten.conv_transpose3d.input: _CONV,
}

# The same families in the Edge dialect, by operator name, for reading lowered programs.
EDGE_GEMM_NAMES = frozenset({"aten.linear.default", "aten.addmm.default", "aten.mm.default",
                             "aten.convolution.default", "aten.bmm.default"})
EDGE_SPLIT_NAMES = frozenset({"aten.split_with_sizes_copy.default", "aten.split_copy.Tensor",
                              "aten.unbind_copy.int", "aten.split.Tensor",
                              "aten.split_with_sizes.default", "aten.unbind.int",
                              "aten.chunk.default"})


def gemm_spec(node: torch.fx.Node) -> Optional[GemmSpec]:
    if node.op != "call_function":
        return None
    return GEMM_SPECS.get(node.target)


def operand(node: torch.fx.Node, index: Optional[int]) -> Optional[torch.fx.Node]:
    """The node passed at ``index`` (positionally or by its schema name), if it is a node."""
    if index is None:
        return None
    if index < len(node.args):
        value = node.args[index]
    else:
        schema = getattr(node.target, "_schema", None)
        if schema is None or index >= len(schema.arguments):
            return None
        value = node.kwargs.get(schema.arguments[index].name)
    return value if isinstance(value, torch.fx.Node) else None


def operand_roles(node: torch.fx.Node) -> list:
    """(role, node) for the weight and bias of a GEMM; absent operands are left out."""
    spec = gemm_spec(node)
    if spec is None:
        return []
    roles = [("weight", operand(node, spec.weight)), ("bias", operand(node, spec.bias))]
    return [(role, arg) for role, arg in roles if arg is not None]


def op_name(target) -> str:
    """``aten.linear.default`` for an OpOverload (ATen or Edge), else the callable's name."""
    name = getattr(target, "__name__", None) or str(target)
    schema = getattr(target, "_schema", None)
    if schema is not None:
        overload = schema.overload_name or "default"
        return f"{schema.name.replace('::', '.')}.{overload}"
    return name


def source_module(node: torch.fx.Node) -> Optional[str]:
    """The module of the user's code a node came from, as ``path (Class)``: the innermost entry
    of the ``nn_module_stack`` that torch.export records (``layer.multihead_attn
    (MultiheadAttention)``); ``None`` for a node of the top-level forward or one without it."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, type_name = list(stack.values())[-1]
    class_name = str(getattr(type_name, "__name__", type_name)).rsplit(".", 1)[-1]
    return f"{path or '<top level>'} ({class_name})"
