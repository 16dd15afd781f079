"""Packed projections: one linear whose output MHA cuts into parts, rewritten as one per part.

``nn.MultiheadAttention`` projects q/k/v (or k/v) with one linear over a packed weight, then
separates the parts of its output with a layout chain::

    y = linear(x, W, b)                    # (..., n*E)
    y.unflatten(-1, [n, E]).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()  # (n, ..., E)
    part_i = y[i]                          # select(0, i): (..., E)

In executorch 1.5.1 ``select_copy`` and ``squeeze_copy`` have no XNNPACK config, so the chain
stays on portable and cuts the attention into extra delegates, even in self-attention, where
stock delegates the linear itself. ``part_i`` is ``linear(x, W[i*E:(i+1)*E], b[i*E:(i+1)*E])``,
element for element, so each ``select`` is replaced by such a linear and the chain is dropped.
The row blocks are ``slice`` nodes of ``W`` and ``b``: computed weights like any other, which
the fold then turns into constants under the same rules. A rewrite whose part linears are not
all folded and delegated is undone (the fold step, :mod:`xnnfold.steps.fold`), so it never leaves
more on portable than stock does. A PT2E-quantized projection (an int8 weight behind a
dequantize, the output's q/dq) is cut into int8 row blocks the same way: :mod:`.quantized`.
The split itself: :mod:`.split`; what ``explain`` says of each: :mod:`.record`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ...analysis import ProgramFacts, cone_of, is_dequantize
from ...graph.node_meta import tensor_val
from ...analysis.gemms import operand
from . import quantized
from .record import PackedProjection
from .split import split_packed_projections  # noqa: F401 - the step's API (xnnfold.steps.fold)

aten = torch.ops.aten

_CONTIGUOUS_OPS = (aten.contiguous.default, aten.clone.default)


def _only_user(node: torch.fx.Node, *targets) -> Optional[torch.fx.Node]:
    """The single user of ``node`` if it is a call to one of ``targets``."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op != "call_function" or user.target not in targets or user.args[0] is not node:
        return None
    return user


def _rank(node: torch.fx.Node) -> Optional[int]:
    val = tensor_val(node)
    return val.dim() if val is not None else None


def _dim_is(dim, wanted: int, rank: int) -> bool:
    return isinstance(dim, int) and -rank <= dim < rank and dim % rank == wanted


def _has_dequantize(node: torch.fx.Node, facts: ProgramFacts) -> bool:
    # A quantized weight would be folded as its fp32 value: never rewrite those.
    return any(is_dequantize(n) for n in cone_of(node, facts))


def _static_operand(node: Optional[torch.fx.Node], facts: ProgramFacts) -> bool:
    if node is None:
        return True
    if node not in facts.static or _has_dequantize(node, facts):
        return False
    val = tensor_val(node)
    return val is not None and val.is_floating_point()


def match(linear: torch.fx.Node, facts: ProgramFacts) -> Optional[PackedProjection]:
    """The packed projection rooted at ``linear``, or None if the chain is not MHA's exactly."""
    if linear.op != "call_function" or linear.target is not aten.linear.default:
        return None
    weight, bias = operand(linear, 1), operand(linear, 2)
    int8_weight = quantized.quantized_weight(weight, facts) if weight is not None else None
    if weight is None or not (int8_weight or _static_operand(weight, facts)) or \
            not _static_operand(bias, facts):
        return None
    rank = _rank(linear)
    # A statically quantized output: the chain starts after its q/dq, repeated per part.
    qdq = quantized.output_qdq(linear) if int8_weight is not None else None
    unflatten = _only_user(qdq[1] if qdq else linear, aten.unflatten.int)
    if rank is None or unflatten is None or len(unflatten.args) != 3:
        return None
    _, dim, sizes = unflatten.args
    out_features = linear.meta["val"].shape[-1]
    if not _dim_is(dim, rank - 1, rank) or not isinstance(out_features, int) or \
            len(sizes) != 2 or not all(isinstance(s, int) and s > 0 for s in sizes) or \
            sizes[0] * sizes[1] != out_features:
        return None
    parts, width = sizes
    # (..., n, E) -> (1, ..., n, E) -> (n, ..., 1, E) -> (n, ..., E): part i at index i.
    unsqueeze = _only_user(unflatten, aten.unsqueeze.default)
    if unsqueeze is None or not _dim_is(unsqueeze.args[1], 0, rank + 2):
        return None
    transpose = _only_user(unsqueeze, aten.transpose.int)
    if transpose is None or sorted(d % (rank + 2) for d in transpose.args[1:3]
                                   if isinstance(d, int)) != [0, rank]:
        return None
    squeeze = _only_user(transpose, aten.squeeze.dim)
    if squeeze is None or not _dim_is(squeeze.args[1], rank, rank + 2):
        return None
    layout = [unflatten, unsqueeze, transpose, squeeze]
    # .contiguous() is traced away where the squeezed tensor already is contiguous (1-D input)
    contiguous = _only_user(squeeze, *_CONTIGUOUS_OPS)
    if contiguous is not None:
        if contiguous.kwargs.get("memory_format",
                                 torch.contiguous_format) != torch.contiguous_format:
            return None
        layout.append(contiguous)
    last = layout[-1]
    selects = {}
    for user in last.users:
        if user.op != "call_function" or user.target is not aten.select.int or \
                user.args[0] is not last or not _dim_is(user.args[1], 0, rank + 1) or \
                not isinstance(user.args[2], int) or not -parts <= user.args[2] < parts:
            return None
        index = user.args[2] % parts
        if index in selects:   # the same part taken twice: keep the graph as it is
            return None
        selects[index] = user
    if not selects:
        return None
    layout = list(qdq or ()) + layout
    return PackedProjection(linear.name, parts, width, [n.name for n in layout],
                            {i: n.name for i, n in selects.items()},
                            found=(linear, layout, selects), int8_weight=int8_weight,
                            output_qdq=qdq)


def find_packed_projections(facts: ProgramFacts) -> list:
    return [site for node in facts.ep.graph.nodes
            if (site := match(node, facts)) is not None]


def found_in(result) -> list:
    """The packed projections a :class:`~xnnfold.result.FoldResult`'s fold step found, split
    or kept."""
    return [r for r in result.of("fold") if isinstance(r, PackedProjection)]


def split_in(result) -> list:
    """Those of :func:`found_in` that were split."""
    return [r for r in found_in(result) if r.rewritten]
