"""``pow(x, 3)`` and ``pow(x, 2.0)`` written as the multiplications torch's CPU kernel computes.

executorch 1.5.1's XNNPACK ``PowConfig`` takes ``pow.Tensor_Scalar`` only for the *integer*
exponent 2 (XNNPACK's square). The cube of transformers' ``gelu_new`` (GPT-2, GPT-Neo, T5 v1.1,
Flan-T5, mT5, CodeGen: ``0.044715 * torch.pow(x, 3.0)``) and a square written with a float
exponent (``x ** 2.0``) stay on the portable kernel, which computes ``std::pow``, and split the
delegate around them. torch's CPU kernel computes these exponents as products
(``pow_tensor_scalar_optimized_kernel``: ``x * x`` and ``x * x * x``, left to right; measured
bit for bit equal on 2^20 random values, where the correctly rounded cube differs in 26% of
them). This step writes each such fp32 node as those ``mul`` nodes, each correctly rounded in
XNNPACK too: the .pte computes eager's bits, where the portable kernel's ``std::pow`` does not.
Other exponents, other dtypes and the integer 2 (XNNPACK's own) are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram

from ..graph.emit import Emitter, replace_each
from ..graph.node_meta import tensor_val
from .protocol import Context, Outcome

aten = torch.ops.aten


@dataclass(frozen=True)
class PowerRewrite:
    """One ``pow(x, exponent)`` node, written as products or left (``reason``)."""

    node: str
    exponent: object
    rewritten: bool
    reason: str = ""

    def describe(self) -> str:
        if self.rewritten:
            return (f"powers step: {self.node} (pow, {self.exponent!r}) written as "
                    f"{'x*x*x' if self.exponent == 3 else 'x*x'}, as torch's CPU kernel "
                    "computes it (XNNPACK takes only the integer square)")
        return f"powers step: {self.node} (pow, {self.exponent!r}) left as is: {self.reason}"


def _exponent(node: torch.fx.Node):
    """The scalar exponent of a ``pow.Tensor_Scalar`` node this step writes as products (3 or
    3.0, or the float 2.0), else None."""
    if node.op != "call_function" or node.target is not aten.pow.Tensor_Scalar:
        return None
    exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return None
    if exponent == 3 or (isinstance(exponent, float) and exponent == 2.0):
        return exponent
    return None


def _left_because(node: torch.fx.Node):
    source = node.args[0]
    value, given = tensor_val(node), tensor_val(source) if isinstance(source, torch.fx.Node) \
        else None
    if value is None or given is None or value.dtype != torch.float32 or \
            given.dtype != torch.float32:
        return "not fp32 to fp32 (XNNPACK multiplies fp32; the portable kernel keeps the rest)"
    return None


def write_powers_as_products(program: ExportedProgram) -> list:
    """Write, in place, every fp32 ``pow(x, 3)`` and ``pow(x, 2.0)`` of ``program`` (the pass's
    own copy, ATen dialect) as ``mul`` nodes; a :class:`PowerRewrite` for each. A failure on
    one node leaves only it as stock has it."""
    exponents = {node: _exponent(node) for node in program.graph.nodes}
    sites = [node for node, exponent in exponents.items() if exponent is not None]

    def write(emit: Emitter, node: torch.fx.Node) -> torch.fx.Node:
        x = node.args[0]
        written = emit(aten.mul.Tensor, x, x)
        return emit(aten.mul.Tensor, written, x) if exponents[node] == 3 else written

    names = {node.name: exponents[node] for node in sites}
    return replace_each(program.graph, sites, _left_because, write,
                        lambda name, reason: PowerRewrite(name, names[name], reason is None,
                                                          reason or ""), "pow")


class PowersStep:
    name = "powers"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(write_powers_as_products(program))


STEP = PowersStep()
