"""The probe program: the distinct probe contexts side by side in one GraphModule.

:func:`build_module` lays the contexts of :mod:`probe.cut` side by side, each external
a probe buffer or user input of the same dtype, shape and dynamic dims (with the program's
ranges), which :mod:`probe.fast` exports afresh (its own ShapeEnv) and asks the
partitioner about. Nothing here lowers anything: the builder is tested in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sympy
import torch
import torch.fx
from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

from .cut import PROBE_GEMM, ProbeUnsupported

_INFINITIES = (IntInfinity, NegativeIntInfinity)


# --------------------------------------------------------------------------------------------
# The probe module


@dataclass
class ProbeModule:
    """A GraphModule of contexts side by side, and how to call and export it."""

    module: torch.fx.GraphModule
    inputs: tuple
    dynamic_shapes: Optional[tuple]
    slots: dict            # probe buffer name -> (context index, external index)


def _is_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, torch.Tensor) for v in value)


def _example(value: torch.Tensor, shape: tuple) -> torch.Tensor:
    # Never read: the partitioner sees fake tensors. torch.empty commits no pages.
    return torch.empty(shape, dtype=value.dtype)


def _hint(size, node_name: str) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    if hint is None:
        raise ProbeUnsupported(node_name, f"dim {size} has no size hint (data-dependent)")
    return int(hint)


def _bounded(bound) -> bool:
    """A range bound that is a number: not sympy's infinities, nor torch's ``int_oo`` (the upper
    bound of ``Dim.DYNAMIC`` / ``Dim.AUTO``), which calls itself finite (``is_finite`` is True)."""
    return bool(bound.is_number) and not isinstance(bound, _INFINITIES) and \
        bound not in (sympy.oo, -sympy.oo)


class _Dims:
    """One torch.export.Dim per symbol of the program, with the program's range for it."""

    def __init__(self, ranges: dict):
        self._ranges = ranges
        self._dims: dict = {}

    def _dim(self, symbol, node_name: str):
        if symbol not in self._dims:
            bounds = self._ranges.get(symbol)
            if bounds is None:
                raise ProbeUnsupported(node_name, f"no range for symbol {symbol}")
            low, high = bounds.lower, bounds.upper
            kwargs = {"min": int(low)} if _bounded(low) else {}
            if _bounded(high):
                kwargs["max"] = int(high)
            self._dims[symbol] = torch.export.Dim(f"probe_{symbol}", **kwargs)
        return self._dims[symbol]

    def spec(self, size, node_name: str):
        """None for a static size; a Dim (or a derived one, a*Dim + b) for a symbolic one."""
        if isinstance(size, int):
            return None
        expr = size.node.expr
        if expr.is_number:
            return None
        (symbol, *more) = list(expr.free_symbols)
        if more:
            raise ProbeUnsupported(node_name, f"dim {expr} of several symbols")
        dim = self._dim(symbol, node_name)
        if expr == symbol:
            return dim
        try:
            poly = sympy.Poly(expr, symbol)
        except sympy.PolynomialError:      # e.g. a floor division (conv strides): s0//10
            raise ProbeUnsupported(node_name, f"dim {expr} is not a polynomial in {symbol}")
        coeffs = poly.all_coeffs()
        if poly.degree() != 1 or not all(c.is_integer for c in coeffs):
            raise ProbeUnsupported(node_name, f"dim {expr} is not linear in {symbol}")
        scale, offset = int(coeffs[0]), int(coeffs[1])
        derived = dim * scale if scale != 1 else dim
        return derived + offset if offset else derived


# Meta that ties a node to the program's fake tensors and ShapeEnv: never carried into the
# probe, which export traces afresh with its own.
_TRACE_META = ("val", "tensor_meta", "unbacked_bindings", "example_value")


def _renamed_source(meta: dict, prefix: str) -> dict:
    """Node meta with source names made unique per context: XNNPACK's addmm config groups the
    nodes of one ``linear`` by these names, and two contexts must never be grouped."""
    meta = {k: v for k, v in meta.items() if k not in _TRACE_META}
    if meta.get("torch_fn"):
        name, fn = meta["torch_fn"]
        meta["torch_fn"] = (f"{prefix}{name}", fn)
    if meta.get("source_fn_stack"):
        meta["source_fn_stack"] = [(f"{prefix}{name}", fn)
                                   for name, fn in meta["source_fn_stack"]]
    return meta


_aten = torch.ops.aten


def _as_convolution(node: torch.fx.Node, original: torch.fx.Node) -> None:
    """Rewrite a ``conv1d`` / ``conv2d`` / ``conv_transpose{1,2}d`` as the ``convolution`` the
    lowering decomposes it into (ATen's own composite: same arguments, output_padding 0), so
    that XNNPACK's convolution config can be asked about it without decomposing the probe."""
    if node.kwargs:
        return
    args = list(node.args)
    if node.target in (_aten.conv1d.default, _aten.conv2d.default):
        defaults = [None, None, None, [1], [0], [1], 1]
        x, w, b, stride, padding, dilation, groups = args + defaults[len(args):]
        spatial = original.args[1].meta["val"].dim() - 2
        node.target = _aten.convolution.default
        node.args = (x, w, b, stride, padding, dilation, False, [0] * spatial, groups)
    elif node.target in (_aten.conv_transpose1d.default, _aten.conv_transpose2d.input):
        defaults = [None, None, None, [1], [0], [0], 1, [1]]
        x, w, b, stride, padding, output_padding, groups, dilation = args + defaults[len(args):]
        node.target = _aten.convolution.default
        node.args = (x, w, b, stride, padding, dilation, True, output_padding, groups)


def build_module(contexts: list, ranges: dict) -> ProbeModule:
    """One GraphModule computing every context of ``contexts``, side by side."""
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    inputs, specs, slots, outputs = [], [], {}, []
    dims = _Dims(ranges)
    envs = [dict() for _ in contexts]
    # Placeholders first (graph order), then each context's buffers and body.
    for c_index, context in enumerate(contexts):
        for e_index, external in enumerate(context.externals):
            if external.is_param:
                continue
            value, name = external.node.meta["val"], external.node.name
            placeholder = graph.placeholder(f"x{c_index}_{e_index}")
            inputs.append(_example(value, tuple(_hint(s, name) for s in value.shape)))
            spec = {i: d for i, s in enumerate(value.shape)
                    if (d := dims.spec(s, name)) is not None}
            specs.append(spec or None)
            envs[c_index][external.node] = placeholder
    for c_index, context in enumerate(contexts):
        env = envs[c_index]
        for e_index, external in enumerate(context.externals):
            if not external.is_param:
                continue
            value, name = external.node.meta["val"], external.node.name
            buffer = f"p{c_index}_{e_index}"
            root.register_buffer(buffer, _example(value, tuple(_hint(s, name)
                                                              for s in value.shape)))
            env[external.node] = graph.get_attr(buffer)
            slots[buffer] = (c_index, e_index)
        inside = set(context.nodes)
        for node in context.nodes:
            copied = graph.node_copy(node, lambda n: env[n])
            copied.meta = _renamed_source(node.meta, f"probe{c_index}_")
            if node is context.gemm:
                copied.meta["custom"] = {**copied.meta.get("custom", {}), PROBE_GEMM: c_index}
                _as_convolution(copied, node)
            env[node] = copied
        for node in context.nodes:
            # Every value read outside the context is an output, so that export's dead-code
            # elimination keeps each user (a GEMM's number of users is part of the decision).
            leaves_context = any(u not in inside for u in node.users) or not node.users
            if leaves_context and _is_tensors(node.meta.get("val")):
                outputs.append(env[node])
    graph.output(tuple(outputs))
    module = torch.fx.GraphModule(root, graph)
    dynamic = tuple(specs) if any(s is not None for s in specs) else None
    return ProbeModule(module, tuple(inputs), dynamic, slots)
