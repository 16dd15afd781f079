"""A batched ``matmul`` of two activations rewritten as ``bmm`` on 3-D views.

Attention written by hand (transformers' ``attn_implementation="eager"``: ``q @ k.transpose``,
``weights @ v``) multiplies 4-D tensors with ``matmul``. torch decomposes a batched ``matmul``
into ``expand`` of each operand to the broadcast batch shape, ``view`` to 3-D and ``bmm``; the
``expand`` is a copy on portable (XNNPACK takes no ``expand_copy``), even when each operand
already has that shape. When both operands have the same batch dims the expand is the identity,
and ``reshape`` to 3-D, ``bmm``, ``reshape`` back computes the very same values. An operand
that is a transpose of its last two dims is reshaped first and transposed as 3-D, so that no
copy of it is needed before XNNPACK's ``permute``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx

from . import quantized
from ...graph.node_meta import tensor_val
from ...graph.emit import MAX_RANK, Emitter, reshape_arg, static_shape
from .restride import replace_uses

aten = torch.ops.aten
MATMUL = aten.matmul.default
SAME_BATCH = "same batch dims, no expand"


def is_batched(node: torch.fx.Node) -> bool:
    """A ``matmul`` whose operands both have batch dims (rank 3 or more)."""
    if node.op != "call_function" or node.target is not MATMUL or len(node.args) != 2:
        return False
    a, b = (tensor_val(x) for x in node.args)
    return a is not None and b is not None and a.dim() >= 3 and b.dim() >= 3


def why_kept(node: torch.fx.Node) -> Optional[str]:
    """Why this batched ``matmul`` is left as it was, or None if the rewrite applies."""
    a, b = (tensor_val(x) for x in node.args)
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        return f"dtype {a.dtype}: XNNPACK's bmm is taken in fp32 only"
    if a.dim() != b.dim() or a.dim() > MAX_RANK or a.shape[:-2] != b.shape[:-2]:
        return (f"batch shapes {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} differ: the "
                "expand is a real broadcast")
    if not static_shape(a.shape[:-2]):
        return "dynamic batch sizes: XNNPACK takes no reshape to a symbolic shape"
    if any(reshape_arg(shape) is None for shape in (a.shape[-2:], b.shape[-2:],
                                                     tensor_val(node).shape[-2:])):
        return ("two dynamic dims in one operand or the product: XNNPACK's reshape infers at "
                "most one")
    if 0 in a.shape or 0 in b.shape:
        return "empty operand"
    return None


def _last_two_transposed(node) -> Optional[torch.fx.Node]:
    """``x`` if ``node`` is ``x.transpose(-2, -1)`` (any spelling of the last two dims)."""
    if node.op != "call_function" or node.target is not aten.transpose.int:
        return None
    rank = tensor_val(node).dim()
    dims = sorted(d % rank for d in node.args[1:3])
    return node.args[0] if dims == [rank - 2, rank - 1] else None


def _as_3d(emit: Emitter, node: torch.fx.Node, batch: int) -> torch.fx.Node:
    rows, cols = tensor_val(node).shape[-2:]
    source = _last_two_transposed(node)
    if source is not None:
        return emit(aten.transpose.int,
                    emit(aten.reshape.default, source, reshape_arg([batch, cols, rows])), 1, 2)
    return emit(aten.reshape.default, node, reshape_arg([batch, rows, cols]))


def rewrite_one(emit: Emitter, node: torch.fx.Node) -> str:
    """Replace ``node`` (a batched matmul :func:`why_kept` accepts) by reshape, bmm, reshape."""
    a, b = node.args
    lead = list(tensor_val(a).shape[:-2])
    batch = math.prod(lead)
    product = emit(aten.bmm.default, _as_3d(emit, a, batch), _as_3d(emit, b, batch))
    out = emit(aten.reshape.default, product, reshape_arg(lead + list(tensor_val(node).shape[-2:])))
    replace_uses(node, out)      # the users' strides kept traceable
    emit.graph.erase_node(node)
    return quantized.note(SAME_BATCH, (a, b))
