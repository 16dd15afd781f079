"""Canonical GEMMs: a GEMM whose weight is a transpose becomes ``linear`` on the untransposed one.

``addmm(b, x, W.t())`` *is* ``linear(x, W, b)``, and ``mm(x, W.t())``, ``x @ W.T``,
``matmul(x, W.transpose(0, 1))`` are ``linear(x, W)``: ``linear`` decomposes back into exactly
those ops wherever it is not delegated, so the rewrite changes no value. Models write the
transposed forms for tied output heads (``x @ embedding.weight.t()``) and hand-written gates.
XNNPACK declines them (its weight is the transpose, not a param); as ``linear`` the weight is
the param itself, or a computed weight that one folded constant serves in every form.

The rewrite is made in place on the caller's copy, node names kept, so that every later step
(and ``explain``) speaks of the GEMM the user's program has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from ..analysis import find_static
from ..analysis.gemms import op_name
from ..graph.node_meta import tensor_val
from .protocol import Context, Outcome

aten = torch.ops.aten

_TRANSPOSES = (aten.t.default, aten.numpy_T.default, aten.mT.default, aten.transpose.int,
               aten.permute.default)


@dataclass(frozen=True)
class CanonicalRewrite:
    """One GEMM rewritten as ``linear``: its name, the op it was, and the weight it now takes."""

    gemm: str
    was: str
    weight: str
    rewritten = True

    def describe(self) -> str:
        return (f"{self.gemm}: {self.was} of a transposed weight rewritten as "
                f"linear on {self.weight}")


def untransposed(node) -> Optional[torch.fx.Node]:
    """``W`` if ``node`` is the transpose of a 2-D tensor ``W``, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or \
            node.target not in _TRANSPOSES or not isinstance(node.args[0], torch.fx.Node):
        return None
    source, val = node.args[0], tensor_val(node.args[0])
    if val is None or val.dim() != 2:
        return None
    if node.target is aten.transpose.int:
        if sorted(d % 2 for d in node.args[1:3]) != [0, 1]:
            return None
    elif node.target is aten.permute.default:
        if [d % 2 for d in node.args[1]] != [1, 0]:
            return None
    return source


def linear_args(node: torch.fx.Node) -> Optional[tuple]:
    """The ``(x, W[, b])`` of ``linear`` that computes ``node`` exactly, or None."""
    if node.op != "call_function" or node.kwargs.get("out") is not None:
        return None
    if node.target in (aten.mm.default, aten.matmul.default) and len(node.args) == 2:
        x, transposed = node.args
        bias = None
    elif node.target is aten.addmm.default and len(node.args) == 3 and \
            node.kwargs.get("beta", 1) == 1 and node.kwargs.get("alpha", 1) == 1:
        bias, x, transposed = node.args
    else:
        return None
    weight = untransposed(transposed)
    x_val, w_val, out = tensor_val(x), tensor_val(weight), tensor_val(node)
    if weight is None or x_val is None or out is None or x_val.dtype != w_val.dtype:
        return None
    if bias is not None:
        # addmm broadcasts its bias over rows; linear's bias is one value per output feature.
        b_val = tensor_val(bias)
        if b_val is None or b_val.dim() != 1 or b_val.dtype != w_val.dtype or \
                not isinstance(b_val.shape[0], int) or b_val.shape[0] != w_val.shape[0]:
            return None
    return (x, weight) if bias is None else (x, weight, bias)


def _rewritable(node: torch.fx.Node, static: set) -> Optional[tuple]:
    # A GEMM of static inputs is a step of some weight's computation: evaluated as written.
    args = linear_args(node)
    return args if args is not None and args[0] not in static else None


def canonicalize(program: ExportedProgram, static: set) -> list:
    """Rewrite, in place, every transposed-weight GEMM of ``program`` (the caller's own copy)
    whose activation is not static, as ``linear``. ``static``: the static nodes of ``program``."""
    rewrites = []
    graph = program.graph
    for node in list(graph.nodes):
        args = _rewritable(node, static)
        if args is None:
            continue
        transposed = node.args[1] if node.target is not aten.addmm.default else node.args[2]
        rewrites.append(CanonicalRewrite(node.name, op_name(node.target), args[1].name))
        node.target, node.args, node.kwargs = aten.linear.default, args, {}
        if not transposed.users:
            graph.erase_node(transposed)
    return rewrites


class CanonicalStep:
    name = "canonical"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(canonicalize(program, find_static(program).static))


STEP = CanonicalStep()
