"""A linear with a run-time weight, its operands swapped when the activation is the smaller: the
one XNNPACK packs on every call is then the activation."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx

from ...graph.node_meta import tensor_val

aten = torch.ops.aten


def static_shape(node) -> Optional[tuple]:
    val = tensor_val(node)
    shape = tuple(val.shape) if val is not None else None
    return shape if shape is not None and all(isinstance(s, int) for s in shape) else None


def _call(graph, target, args, name):
    node = graph.create_node("call_function", target, args, name=name)
    node.meta["val"] = target(*torch.fx.node.map_arg(args, lambda n: n.meta["val"]))
    return node


def swap_if_smaller(graph: torch.fx.Graph, gemm: torch.fx.Node) -> bool:
    """Rewrite ``linear(x, W[, b])`` as ``linear(W, x).t() [+ b]`` when ``x`` is the smaller.

    A run-time weight is packed on every call. ``x @ W.T`` is ``(W @ x.T).T``: with the
    operands swapped, the one packed is the activation (a few rows) and ``W`` is read as it is
    — for a tied head, 8 rows against a 51,865-row table. Static shapes only.
    """
    x, weight = gemm.args[0], gemm.args[1]
    bias = gemm.args[2] if len(gemm.args) > 2 else None
    x_shape, w_shape, out_shape = static_shape(x), static_shape(weight), static_shape(gemm)
    if None in (x_shape, w_shape, out_shape) or len(x_shape) == 0 or \
            math.prod(x_shape) >= math.prod(w_shape):
        return False
    users = list(gemm.users)
    rows = x
    with graph.inserting_before(gemm):
        if len(x_shape) != 2:
            rows = _call(graph, aten.reshape.default, (x, [-1, w_shape[1]]), f"{gemm.name}_rows")
    gemm.args = (weight, rows)
    gemm.meta["val"] = aten.linear.default(weight.meta["val"], rows.meta["val"])
    with graph.inserting_after(gemm):
        out = _call(graph, aten.permute.default, (gemm, [1, 0]), f"{gemm.name}_swapped_back")
    if bias is not None:
        with graph.inserting_after(out):
            out = _call(graph, aten.add.Tensor, (out, bias), f"{gemm.name}_bias")
    if len(out_shape) != 2:
        with graph.inserting_after(out):
            out = _call(graph, aten.reshape.default, (out, list(out_shape)), f"{gemm.name}_out")
    for user in users:
        user.replace_input_with(gemm, out)
    return True
