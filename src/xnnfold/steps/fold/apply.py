"""Fold: evaluate the planned nodes, replace them by constants, drop what they freed.

Works on a copy of the program; the caller's ExportedProgram is never touched. The copy shares
tensor data with the original (nothing here writes into a tensor), so copying costs graph size,
not model size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
from executorch.backends.transforms.utils import delete_constant_placeholder
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ...analysis import is_metadata_assertion
from ...errors import FoldError, at_node
from ...graph.node_meta import tensor_val
from ...graph.constants import new_constant
from ...graph.program_copy import copy_with_nodes
from .evaluate import ConeEvaluator, own_storage



@dataclass
class FoldedConstant:
    """One constant xnnfold put into the program."""

    name: str                     # placeholder name in the folded program
    source: str                   # the node it replaces
    consumers: list               # names of the GEMMs (or dequantize) reading it
    shape: tuple
    dtype: torch.dtype


@dataclass
class Folded:
    program: ExportedProgram
    constants: list = field(default_factory=list)   # FoldedConstant
    freed_params: list = field(default_factory=list)  # state_dict / constants keys dropped


def _checked_value(node: torch.fx.Node, value) -> torch.Tensor:
    """The evaluated value, in its own storage, after checking it is what the graph expects."""
    expected = tensor_val(node)
    if not isinstance(value, torch.Tensor) or expected is None:
        raise FoldError(node.name, "evaluated to a non-tensor")
    if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
        raise FoldError(node.name, f"evaluated to {tuple(value.shape)} {value.dtype}, the graph "
                                   f"expects {tuple(expected.shape)} {expected.dtype}")
    return own_storage(value)


def apply_folds(ep: ExportedProgram, evaluator: ConeEvaluator, members: list) -> Folded:
    """Fold ``members`` (plan.FoldNode, nodes of ``ep``) into constants, in a copy of ``ep``.

    ``evaluator`` evaluates nodes of ``ep`` (and keeps their values across the probe rounds).
    """
    program, nodes = copy_with_nodes(ep)
    folded = Folded(program)
    graph = program.graph
    users_before = {n: len(n.users) for n in graph.nodes if n.op == "placeholder"}

    for member in members:
        with at_node(member.node, "folding"):
            value = _checked_value(member.node, evaluator.value(member.node))
            constant = new_constant(program, member.name, value)
            for consumer in member.consumers:
                nodes[consumer].replace_input_with(nodes[member.node], constant)
            folded.constants.append(FoldedConstant(
                constant.name, member.name, [c.name for c in member.consumers],
                tuple(value.shape), value.dtype))

    # Drop the cone nodes nothing reads any more (latest first), then the params they freed.
    cone = {nodes[n] for m in members for n in m.cone}
    for node in reversed(list(graph.nodes)):
        if node not in cone:
            continue
        if all(is_metadata_assertion(u) for u in node.users):
            for assertion in list(node.users):
                graph.erase_node(assertion)
            graph.erase_node(node)
    signature = program.graph_signature
    targets = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
               **signature.inputs_to_lifted_tensor_constants}
    for node in [n for n in graph.nodes if n.op == "placeholder"]:
        if node.name not in targets or len(node.users) >= users_before.get(node, 0):
            continue   # not a param, or the fold took none of its users
        # ``.to()`` asserts the metadata of the *param* it casts: once the cast is folded, the
        # assertion is all that keeps the param alive. It holds by construction on a value
        # that never changes, so it goes with the param (as plan.freed_nodes counts it).
        if node.users and all(is_metadata_assertion(u) for u in node.users):
            for assertion in list(node.users):
                graph.erase_node(assertion)
        if not node.users:
            folded.freed_params.append(targets[node.name])
            delete_constant_placeholder(program, node)

    graph.lint()
    program.graph_module.recompile()
    return folded
