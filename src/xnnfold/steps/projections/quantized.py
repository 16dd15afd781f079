"""The packed projection of a PT2E-quantized MHA (XNNPACK's quantizer), split per part.

After ``convert_pt2e`` the packed in-projection reads, statically quantized::

    x_dq = dequantize_per_tensor(x_q, s_x, z_x)        # one per user: PT2E duplicates dq nodes
    W = dequantize_per_channel(W_int8, scales, zeros, 0, ...)   # or dequantize_per_tensor
    y = dequantize_per_tensor(quantize_per_tensor(linear(x_dq, W, b), s_y, z_y), s_y, z_y)
    y.unflatten(...) ... select(i)                      # MHA's layout chain, as in fp32

and dynamically quantized, ``x_dq = dequantize_per_tensor.tensor(...)`` (shared by the GEMMs
that read ``x``, as PT2E leaves it) and no q/dq after the linear.

Row block ``i`` of such a projection is ``linear(x_dq, dq(W_int8[rows], scales[rows],
zeros[rows], 0), b[rows])``, followed by the same per-tensor q/dq: with a per-tensor weight or
one quantized per output channel (axis 0), an output row depends on its weight row, scale and
zero point only, and a per-tensor q/dq acts element by element. ``W_int8[rows]`` is a
``slice`` of the int8 tensor, a fold target through its dequantize like any quantized weight:
the fold stores it as an int8 constant and keeps the dequantize for XNNPACK, and the packed
int8 tensor goes once every part is folded (no second copy; a split whose parts are not all
folded and delegated is undone). The rows' scales and zero points become constants here, at
the split: the fold folds a dequantize's input, not its quantization parameters, and XNNPACK
reads those from constants. Together they are exactly the packed ones, which go with the
packed dequantize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from ...analysis import ProgramFacts, cone_of, is_dequantize, static_inputs
from ...analysis.gemms import op_name
from ...graph.constants import new_constant


def _is(node, name: str) -> bool:
    """``node`` calls ``quantized_decomposed.<name>``."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
        op_name(node.target) == f"quantized_decomposed.{name}"


def _placeholder_value(node, facts: ProgramFacts) -> Optional[torch.Tensor]:
    return facts.placeholder_values.get(node) if isinstance(node, torch.fx.Node) else None


@dataclass
class QuantizedWeight:
    """``dequantize_per_channel(int8, scales, zeros, 0, ...)`` or ``dequantize_per_tensor(int8,
    scale, zero, ...)``: a projection's int8 weight, cut by rows."""

    dequantize: torch.fx.Node
    per_channel: bool

    def part(self, program: ExportedProgram, graph: torch.fx.Graph, start: int, stop: int,
             stem: str) -> torch.fx.Node:
        """The dequantized rows ``start:stop``: a slice of the int8 tensor (a fold target), and
        for a per-channel weight the rows' scales and zero points as new constants."""
        dq = self.dequantize
        int8 = dq.args[0]
        rows = graph.create_node("call_function", torch.ops.aten.slice.Tensor,
                                 (int8, 0, start, stop), name=f"{stem}_int8")
        rows.meta["val"] = torch.ops.aten.slice.Tensor(int8.meta["val"], 0, start, stop)
        args = list(dq.args)
        args[0] = rows
        if self.per_channel:
            values = static_inputs(program)
            for index, what in ((1, "scales"), (2, "zero_points")):
                packed = values[dq.args[index].name]
                args[index] = new_constant(program, f"{stem}_{what}",
                                           packed[start:stop].clone())
        part = graph.create_node("call_function", dq.target, tuple(args), dict(dq.kwargs),
                                 name=f"{stem}_dequantize")
        part.meta = {**dq.meta, "val": torch.empty_like(dq.meta["val"][start:stop])}
        return part


def quantized_weight(weight: torch.fx.Node, facts: ProgramFacts) -> Optional[QuantizedWeight]:
    """The int8 weight behind ``weight`` if it can be cut by rows: a dequantize of a static int8
    tensor (a param, or computed from params without a dequantize), per tensor with number
    parameters or per output channel (axis 0) with scales and zero points held as constants."""
    if not is_dequantize(weight) or not weight.args:
        return None
    int8 = weight.args[0]
    if not isinstance(int8, torch.fx.Node) or int8 not in facts.static or \
            any(is_dequantize(n) for n in cone_of(int8, facts)):
        return None
    val = int8.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.int8 or val.dim() != 2:
        return None
    if _is(weight, "dequantize_per_tensor.default"):
        scale, zero = weight.args[1:3]
        if isinstance(scale, (int, float)) and isinstance(zero, int):
            return QuantizedWeight(weight, per_channel=False)
        return None
    if _is(weight, "dequantize_per_channel.default") and len(weight.args) >= 4 and \
            weight.args[3] == 0:
        scales, zeros = (_placeholder_value(n, facts) for n in weight.args[1:3])
        if scales is not None and zeros is not None and \
                scales.dim() == 1 == zeros.dim() and len(scales) == len(zeros) == val.shape[0]:
            return QuantizedWeight(weight, per_channel=True)
    return None


def output_qdq(linear: torch.fx.Node) -> Optional[tuple]:
    """``(quantize, dequantize)`` if the linear's one user is a static per-tensor quantize
    whose one user is the dequantize with the same parameters (a statically quantized
    output), else None."""
    if len(linear.users) != 1:
        return None
    q = next(iter(linear.users))
    if not _is(q, "quantize_per_tensor.default") or q.args[0] is not linear or \
            len(q.users) != 1:
        return None
    dq = next(iter(q.users))
    if not _is(dq, "dequantize_per_tensor.default") or dq.args[0] is not q or \
            tuple(dq.args[1:]) != tuple(q.args[1:]) or dq.kwargs != q.kwargs:
        return None
    return q, dq


def part_input(graph: torch.fx.Graph, x: torch.fx.Node, stem: str) -> torch.fx.Node:
    """What part ``stem`` reads: a static per-tensor dequantize is copied for each part (one
    dequantize per user, as PT2E leaves a program and as XNNPACK takes each into its linear);
    anything else (fp32, the dynamic ``dequantize_per_tensor.tensor``) is shared, as PT2E
    shares it."""
    if not _is(x, "dequantize_per_tensor.default"):
        return x
    copy = graph.create_node("call_function", x.target, x.args, dict(x.kwargs),
                             name=f"{stem}_input")
    copy.meta = dict(x.meta)
    return copy


def part_output(graph: torch.fx.Graph, part: torch.fx.Node, qdq: tuple,
                stem: str) -> torch.fx.Node:
    """``part`` quantized and dequantized with the packed output's own parameters."""
    q, dq = qdq
    q_part = graph.create_node("call_function", q.target, (part,) + tuple(q.args[1:]),
                               dict(q.kwargs), name=f"{stem}_quantize")
    q_part.meta = {**q.meta, "val": torch.empty_like(part.meta["val"], dtype=q.meta["val"].dtype)}
    dq_part = graph.create_node("call_function", dq.target, (q_part,) + tuple(dq.args[1:]),
                                dict(dq.kwargs), name=f"{stem}_dequantized")
    dq_part.meta = {**dq.meta, "val": torch.empty_like(part.meta["val"])}
    return dq_part
