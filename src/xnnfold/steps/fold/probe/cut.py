"""Probe contexts: each candidate GEMM with only what XNNPACK's decision on it depends on.

XNNPACK's GEMM configs (``backends/xnnpack/partition/config/gemm_configs.py``) decide on one
GEMM from a small neighbourhood: the GEMM's own arguments (dtypes, shapes, dynamic dims, conv
kind), whether its weight and bias are params, the quantize / dequantize / choose_qparams
pattern in front of its weight and activation (and a ``pad`` before a quantized conv), and its
users (a fused ``relu`` / ``hardtanh``, the quantize after a statically quantized GEMM). A
:class:`Context` is that neighbourhood, cut out of the folded program: the GEMM, the pattern
nodes behind its inputs, its users and, through a fusable user, their users. Every other node it
reads becomes an *external*: a param (buffer) of the probe where the program reads a param,
buffer or lifted constant, a user input otherwise, with the same dtype, shape and dynamic dims.
Contexts that are equal up to names (:func:`signature`) get one answer, so a 16-layer stack
costs one copy of each distinct GEMM. :mod:`probe.program` lays them side by side.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Optional

import sympy
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ....analysis.identity import removed_by_decomposition
from ....analysis.gemms import op_name
from ....graph.node_meta import tensor_val

# The meta key (inside "custom", which export carries over) naming a probe GEMM's context.
PROBE_GEMM = "xnnfold_probe_gemm"

# Ops whose presence around a GEMM changes XNNPACK's verdict on it, matched by name so that
# the quantized_decomposed, torchao and aten spellings are all covered.
_PATTERN_HINTS = ("quantize_per", "dequantize_per", "quantize_affine", "dequantize_affine",
                  "choose_qparams", "constant_pad_nd", "aten.pad.")
# A GEMM user through which the decision looks one node further (fused activation, then the
# quantize of a static-quant GEMM), and same-dtype casts that to_edge removes on the way.
_FUSABLE_HINTS = ("relu", "hardtanh", "quantize_per", "quantize_affine", "_to_copy",
                  "aten.to.", "_assert_tensor_metadata", "clamp")


class ProbeUnsupported(Exception):
    """A context the probe program cannot reproduce (e.g. an unbacked dim); names the node."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"at node {node!r}: {reason}")
        self.node, self.reason = node, reason


@dataclass
class External:
    """A value a context reads but does not compute: a probe buffer or a probe user input."""

    node: torch.fx.Node
    is_param: bool            # a param, buffer or lifted constant of the program
    key: Optional[str]        # its state_dict / constants key, for params


@dataclass
class Context:
    gemm: torch.fx.Node
    nodes: list                              # the cut-out call_function nodes, graph order
    externals: list = field(default_factory=list)   # External, in first-read order


def _name_of(node: torch.fx.Node) -> str:
    return op_name(node.target) if node.op == "call_function" else node.op


def _is_pattern(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:   # the (scale, zero point) of choose_qparams
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and _is_pattern(source)
    name = _name_of(node)
    return any(hint in name for hint in _PATTERN_HINTS)


def _is_fusable(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and any(h in _name_of(node) for h in _FUSABLE_HINTS)


def _is_symbolic_scalar(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def param_keys(program: ExportedProgram) -> dict:
    """Placeholder name -> state_dict / constants key, for params, buffers (mutated ones too:
    XNNPACK's ``is_param_node`` takes any buffer) and lifted constants."""
    return {s.arg.name: s.target for s in program.graph_signature.input_specs
            if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
            and s.target is not None}


def cut_context(gemm: torch.fx.Node, params: dict) -> Context:
    """The neighbourhood of ``gemm`` that XNNPACK's decision on it reads (see module doc)."""
    chosen: dict = {gemm: None}
    # Behind the inputs: the q/dq/choose_qparams/pad pattern, no-op casts of params, and the
    # nodes computing any symbolic size an op of the context takes.
    stack = list(gemm.all_input_nodes)
    # In front: the users, and through a fusable user its users.
    for user in list(gemm.users):
        if user.op != "call_function":
            continue
        chosen[user] = None
        stack.extend(user.all_input_nodes)
        if _is_fusable(user):
            for second in user.users:
                if second.op == "call_function":
                    chosen[second] = None
                    stack.extend(second.all_input_nodes)
    while stack:
        node = stack.pop()
        if node in chosen or node.op != "call_function":
            continue
        # A no-op cast of a param (``b.type_as(x)``) is gone once decomposed: the GEMM then
        # reads the param itself. Kept in the context, it goes the same way in the probe.
        if _is_pattern(node) or _is_symbolic_scalar(node) or \
                removed_by_decomposition(node) is not None:
            chosen[node] = None
            stack.extend(node.all_input_nodes)
    order = {n: i for i, n in enumerate(gemm.graph.nodes)}
    nodes = sorted(chosen, key=order.__getitem__)
    context = Context(gemm, nodes)
    inside = set(nodes)
    seen = set()
    for node in nodes:
        for source in node.all_input_nodes:
            if source in inside or source in seen:
                continue
            seen.add(source)
            if _is_symbolic_scalar(source):
                raise ProbeUnsupported(source.name, "a symbolic size read from a placeholder")
            if tensor_val(source) is None:
                raise ProbeUnsupported(source.name, "an input that is not a tensor")
            key = params.get(source.name) if source.op == "placeholder" else None
            context.externals.append(External(source, key is not None or source.op ==
                                              "get_attr", key))
    return context


# --------------------------------------------------------------------------------------------
# Signature: equal signatures, equal verdicts.


class _Symbols:
    """Renames the free symbols of a context in first-seen order, keeping their ranges."""

    def __init__(self, ranges: dict):
        self._ranges = ranges
        self.names: dict = {}

    def expr(self, value) -> object:
        if isinstance(value, int):
            return value
        expr = value.node.expr if hasattr(value, "node") else value
        if not isinstance(expr, sympy.Expr):
            return repr(expr)
        mapping = {}
        for symbol in sorted(expr.free_symbols, key=str):
            if symbol not in self.names:
                self.names[symbol] = sympy.Symbol(f"d{len(self.names)}", integer=True)
            mapping[symbol] = self.names[symbol]
        return str(expr.xreplace(mapping))

    def ranges(self) -> tuple:
        return tuple((str(new), str(self._ranges.get(old))) for old, new in self.names.items())


def _meta(value, symbols: _Symbols):
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, tuple(symbols.expr(s) for s in value.shape))
    if isinstance(value, (list, tuple)):
        return tuple(_meta(v, symbols) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("S", symbols.expr(value))
    return repr(value)


def signature(context: Context, ranges: dict) -> tuple:
    """What the verdict on ``context`` can depend on, without node names."""
    symbols = _Symbols(ranges)
    local = {e.node: ("ext", i) for i, e in enumerate(context.externals)}
    local.update({n: ("node", i) for i, n in enumerate(context.nodes)})
    rows = [("ext", e.is_param, _meta(e.node.meta.get("val"), symbols))
            for e in context.externals]
    for node in context.nodes:
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: local[n])
        rows.append((_name_of(node), repr(args), _meta(node.meta.get("val"), symbols),
                     node is context.gemm, tuple(u in local for u in node.users),
                     len(node.users)))
    return tuple(rows) + (symbols.ranges(),)
