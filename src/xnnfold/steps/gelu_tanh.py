"""``gelu(x, approximate="tanh")`` written out as the ops XNNPACK computes as written.

executorch 1.5.1's XNNPACK ``GeluConfig`` takes every fp32 ``aten.gelu`` and its GELU node
visitor ignores ``approximate``: the tanh form (Gemma's ``gelu_pytorch_tanh``, GPT-J's and
Phi's ``gelu_new`` when written as ``gelu(approximate="tanh")``) runs as the exact GELU, 4.7e-4
off eager over [-6, 6] in stock's .pte (the exact GELU is 1e-6 from it). This step replaces such
a node by its definition, in the order torch's CPU kernel computes it::

    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))

mul, add and tanh, each of which XNNPACK takes and computes as written (9.5e-7 off eager over
[-6, 6], the portable kernel 2.4e-7). Only fp32 nodes, XNNPACK's only GELU precision (others
stay for the portable kernel, which honours ``approximate``), and not a GELU between a
dequantize and a quantize (a quantized pattern XNNPACK matches as a whole).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram

from ..analysis import is_dequantize
from ..analysis.gemms import op_name
from ..graph.emit import Emitter, replace_each
from ..graph.node_meta import tensor_val
from .protocol import Context, Outcome

aten = torch.ops.aten
# torch's constants (aten/src/ATen/native/cpu/Activation.cpp, GeluKernelImpl)
BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
KAPPA = 0.044715


@dataclass(frozen=True)
class TanhGeluRewrite:
    """One ``gelu(approximate="tanh")`` node, rewritten or left (``reason``)."""

    node: str
    rewritten: bool
    reason: str = ""

    def describe(self) -> str:
        if self.rewritten:
            return (f"gelu_tanh step: {self.node} (gelu, approximate='tanh') written out as "
                    "mul/add/tanh (XNNPACK's GELU computes the exact form)")
        return f"gelu_tanh step: {self.node} left as is: {self.reason}"


def _approximation(node: torch.fx.Node):
    if len(node.args) > 1:
        return node.args[1]
    return node.kwargs.get("approximate", "none")


def _quantized_neighbour(node: torch.fx.Node) -> bool:
    """Between a dequantize and a quantize: a quantized pattern. One side alone is not (a GELU
    whose output a dynamically quantized linear quantizes is an fp32 GELU)."""
    source = node.args[0]
    if not (isinstance(source, torch.fx.Node) and is_dequantize(source)):
        return False
    return any(user.op == "call_function" and "quantize" in op_name(user.target) and
               not is_dequantize(user) for user in node.users)


def _left_because(node: torch.fx.Node):
    """Why ``node`` (a tanh GELU) stays as is, or None to rewrite it."""
    value = tensor_val(node)
    if value is None or value.dtype != torch.float32:
        return "not fp32 (XNNPACK takes fp32 GELUs only; the portable kernel is exact)"
    if _quantized_neighbour(node):
        return "between a dequantize and a quantize (a quantized pattern)"
    return None


def _write_out(emit: Emitter, x: torch.fx.Node) -> torch.fx.Node:
    """The tanh form of the GELU of ``x``, created before the GELU (``emit``'s anchor); its
    last node."""
    cube = emit(aten.mul.Tensor, emit(aten.mul.Tensor, x, x), x)
    inner = emit(aten.mul.Tensor, emit(aten.add.Tensor, x, emit(aten.mul.Tensor, cube, KAPPA)),
                 BETA)
    one_plus = emit(aten.add.Tensor, emit(aten.tanh.default, inner), 1.0)
    return emit(aten.mul.Tensor, emit(aten.mul.Tensor, x, 0.5), one_plus)


def rewrite_tanh_gelus(program: ExportedProgram) -> list:
    """Rewrite, in place, every fp32 ``gelu(approximate="tanh")`` of ``program`` (the pass's
    own copy, ATen dialect) that XNNPACK would take; a :class:`TanhGeluRewrite` for each such
    GELU, rewritten or not. A failure on one GELU leaves only it as stock has it."""
    sites = [node for node in program.graph.nodes
             if node.op == "call_function" and node.target is aten.gelu.default and
             _approximation(node) == "tanh"]
    return replace_each(program.graph, sites, _left_because,
                        lambda emit, node: _write_out(emit, node.args[0]),
                        lambda name, reason: TanhGeluRewrite(name, reason is None, reason or ""),
                        "gelu")


class GeluTanhStep:
    name = "gelu_tanh"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_tanh_gelus(program))


STEP = GeluTanhStep()
