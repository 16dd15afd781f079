"""Analysis: which nodes of a program are static, and which GEMM operands they compute.

A node is *static* when its value is fixed once the program is exported: a parameter, a
buffer that is never mutated, a lifted constant, or a pure op whose tensor inputs are all
static. A GEMM operand that is static but not itself a placeholder is a *fold target*: the
partitioner declines its GEMM today, and folding its *cone* (the static nodes it is computed
from) into one constant would let XNNPACK take it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ..decision import Found
from .gemms import gemm_spec, op_name, operand_roles
from .identity import has_symbols, is_identity, removed_by_decomposition

aten = torch.ops.aten

# Quantize ops of PT2E: a folded weight keeps the dequantize in front of its GEMM so that
# XNNPACK still sees ``dq(int8 constant) -> GEMM``; the target moves to the dequantize's input.
_DEQUANTIZE_NAMES = ("dequantize_per_tensor", "dequantize_per_channel", "dequantize_per_token",
                     "dequantize_affine")
# Ops that only move or view data, between a dequantize and the attention that reads it
# (MHA's packed projection: unflatten, unsqueeze, transpose, squeeze, select, view).
_LAYOUT = (aten.view.default, aten.reshape.default, aten.transpose.int, aten.permute.default,
           aten.contiguous.default, aten.unflatten.int, aten.unsqueeze.default,
           aten.expand.default, aten.clone.default, aten.select.int, aten.squeeze.dim,
           aten.squeeze.dims, aten.slice.Tensor)


@dataclass
class ProgramFacts:
    """What one look at a program tells: static nodes and the tensors behind placeholders."""

    ep: ExportedProgram
    static: set = field(default_factory=set)          # the static nodes of ``ep``'s graph
    why_not_static: dict = field(default_factory=dict)  # node -> (culprit node name, reason)
    placeholder_values: dict = field(default_factory=dict)  # placeholder node -> real tensor


@dataclass
class FoldTarget:
    """One GEMM operand that is computed from static nodes."""

    gemm: torch.fx.Node
    role: str                  # "weight" or "bias"
    node: torch.fx.Node        # the node whose value becomes a constant
    cone: list                 # static call_function nodes it is computed from, in graph order
    through_dequantize: Optional[torch.fx.Node] = None  # the dq kept between constant and GEMM

    @property
    def key(self) -> str:
        return f"{self.gemm.name}.{self.role}"


@dataclass
class Operand:
    """Every weight and bias of every GEMM, with what analysis found about it."""

    gemm: torch.fx.Node
    kind: str
    role: str
    node: torch.fx.Node
    status: Found              # plain, target (to be planned), dynamic
    culprit: Optional[str] = None
    reason: Optional[str] = None
    target: Optional[FoldTarget] = None


def static_inputs(ep: ExportedProgram) -> dict:
    """Placeholder name -> real tensor, for params, unmutated buffers and lifted constants."""
    signature = ep.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    values = {}
    for spec in signature.input_specs:
        if spec.kind == InputKind.PARAMETER:
            values[spec.arg.name] = ep.state_dict[spec.target]
        elif spec.kind == InputKind.BUFFER and spec.target not in mutated:
            values[spec.arg.name] = (ep.state_dict[spec.target] if spec.persistent
                                     else ep.constants[spec.target])
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants[spec.target]
            if isinstance(value, torch.Tensor):
                values[spec.arg.name] = value
    return values


def _is_tensor_result(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, torch.Tensor) for v in value)


def _pure_op_reason(node: torch.fx.Node) -> Optional[str]:
    """Why ``node``'s op cannot be evaluated ahead of time, or None if it can."""
    if node.target is operator.getitem:
        return None
    if not isinstance(node.target, torch._ops.OpOverload):
        return f"{node.target} is not an ATen op"
    schema = node.target._schema
    if schema.is_mutable:
        return f"{op_name(node.target)} mutates its input"
    if not _is_tensor_result(node.meta.get("val")):
        return f"{op_name(node.target)} does not return tensors"
    return None


def find_static(ep: ExportedProgram) -> ProgramFacts:
    """One pass over ``ep``'s graph, in order; the facts are keyed by ``ep``'s own nodes."""
    facts = ProgramFacts(ep=ep)
    values = static_inputs(ep)
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in values:
                facts.static.add(node)
                facts.placeholder_values[node] = values[node.name]
            else:
                facts.why_not_static[node] = (node.name, "is a user input or mutable buffer")
            continue
        if node.op != "call_function":
            continue
        culprit = next((i for i in data_inputs(node) if i not in facts.static), None)
        if culprit is not None:
            facts.why_not_static[node] = facts.why_not_static.get(
                culprit, (culprit.name, "is not static"))
            continue
        reason = _pure_op_reason(node)
        if reason is None and has_symbols(node.meta.get("val")):
            reason = "has a symbolic shape"
        if reason is None and any(has_symbols(a) for a in _flat_args(node)):
            reason = "takes a symbolic size"
        if reason is None:
            facts.static.add(node)
        else:
            facts.why_not_static[node] = (node.name, reason)
    return facts


def _flat_args(node: torch.fx.Node) -> list:
    flat = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), lambda a: flat.append(a) or a)
    return [a for a in flat if not isinstance(a, torch.fx.Node)]


def data_inputs(node: torch.fx.Node) -> list:
    """The inputs whose *values* ``node`` reads. An identity op (``w.type_as(x)``) reads only
    its first: of the others it takes a dtype, which the graph fixes."""
    if node.op == "call_function" and len(node.all_input_nodes) > 1 and is_identity(node):
        return [node.args[0]]
    return node.all_input_nodes


def cone_of(node: torch.fx.Node, facts: ProgramFacts) -> list:
    """The static call_function nodes ``node`` is computed from (itself included)."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in seen or current.op != "call_function":
            continue
        seen.add(current)
        stack.extend(data_inputs(current))
    return [n for n in node.graph.nodes if n in seen]


def is_metadata_assertion(node: torch.fx.Node) -> bool:
    """``_assert_tensor_metadata`` (emitted by ``.to()``): on a static value it holds by
    construction, so it goes away with the value it checks instead of keeping it alive."""
    return node.op == "call_function" and \
        node.target is aten._assert_tensor_metadata.default


def is_dequantize(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and any(
        name in op_name(node.target) for name in _DEQUANTIZE_NAMES)


def dequantized(node) -> bool:
    """True if ``node`` is, through layout ops only, the output of a dequantize."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if is_dequantize(node):
            return True
        if node.target not in _LAYOUT:
            return False
        node = node.args[0]
    return False


def find_operands(ep: ExportedProgram, facts: Optional[ProgramFacts] = None) -> list:
    """Every GEMM weight and bias, classified as plain, dynamic or a fold target.

    A GEMM whose inputs are all static and which lies in the cone of another GEMM's fold target
    (LoRA's ``B @ A``, the ``matmul`` inside parametrizations.orthogonal) is not listed: it is
    a step of that computation, folded with it or, where that fold is declined, left with it.
    Any other GEMM is listed, a static one included (a linear over a learned memory).
    """
    facts = facts or find_static(ep)
    gemms = [(node, gemm_spec(node)) for node in ep.graph.nodes if gemm_spec(node) is not None]
    classified = {}
    for node, spec in gemms:
        if node not in facts.static:
            classified[node] = [_classify(node, spec.kind, role, arg, facts)
                                for role, arg in operand_roles(node)]
    inner = {n for operands in classified.values() for o in operands if o.target
             for n in o.target.cone}
    for node, spec in gemms:
        if node in facts.static and node not in inner:
            classified[node] = [_classify(node, spec.kind, role, arg, facts)
                                for role, arg in operand_roles(node)]
    return [o for node, _ in gemms for o in classified.get(node, [])]


def _classify(gemm, kind, role, arg, facts) -> Operand:
    target_node, dq = arg, None
    # A quantized weight: dq(q(computed)) -> GEMM. Fold up to the dq, keep the dq.
    if is_dequantize(arg) and arg.args and isinstance(arg.args[0], torch.fx.Node):
        target_node, dq = arg.args[0], arg
    if target_node.op == "placeholder" or target_node.op == "get_attr":
        status = Found.PLAIN if target_node in facts.static or target_node.op == "get_attr" \
            else Found.DYNAMIC
        culprit, reason = (None, None) if status == Found.PLAIN else (
            target_node.name, "is a user input or mutable buffer")
        return Operand(gemm, kind, role, arg, status, culprit, reason)
    removed = removed_by_decomposition(target_node)
    if removed is not None and removed[0].args[0] in facts.static:
        return Operand(gemm, kind, role, arg, Found.PLAIN, removed[-1].name,
                       f"{', '.join(op_name(n.target) for n in removed)} on a param is removed "
                       "by decomposition: stock delegates it as is")
    if target_node not in facts.static:
        culprit, reason = facts.why_not_static.get(target_node,
                                                   (target_node.name, "is not static"))
        return Operand(gemm, kind, role, arg, Found.DYNAMIC, culprit, reason)
    target = FoldTarget(gemm, role, target_node, cone_of(target_node, facts), dq)
    return Operand(gemm, kind, role, arg, Found.TARGET, target=target)
