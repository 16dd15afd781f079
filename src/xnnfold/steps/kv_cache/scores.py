"""The scores of a grouped attention and the tensors added to them.

The grouped rewrite (:mod:`.grouped`) computes the scores as ``[B * Hkv, G * L, S]``: the ``G``
query heads of KV head ``k`` are rows ``g * L + l`` of batch ``b * Hkv + k``. A tensor the model
adds to the scores of ``[B, H, L, S]`` (a mask, an ALiBi bias) is read there as:

- shared by the heads (``[1, 1, l, s]``, ``l`` 1 or L): ``[l, s]``, broadcast over the rows of
  every group — the scores viewed ``[B * Hkv, G, L, S]`` when ``l`` is L and ``G > 1``;
- per head (``[b, H, l, s]``): ``[b * Hkv, G, l, s]`` (head ``h = k * G + g``), beside the
  scores viewed ``[B * Hkv, G, L, S]`` (``G == 1``: ``[b * H, l, s]`` beside them as they are).

Each such view of a tensor is built once per program (every layer reads the same mask: the
step merges the repeats, :func:`xnnfold.graph.sdpa.merge_mask_repeats`), on portable where it
is outside a delegate, on the tensor's own size.

:func:`apply_ops` computes an eager attention's ops on the scores (:class:`Op`) in
eager's order on that layout; ``masked_fill(s, m, v)`` becomes ``s * keep + fill`` (``keep =
1 - m``, ``fill = v`` where ``m``, else 0: the same value for any finite score), ops XNNPACK
takes where it has no ``masked_fill``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.fx

from ...graph.node_meta import tensor_val
from ...graph.emit import Emitter, reshape_arg
from ...graph.values import same_size

aten = torch.ops.aten
_TIMES = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)


@dataclass(frozen=True)
class Op:
    """``target(scores, other)`` (``other`` a number or a node that broadcasts to ``[B, H, L,
    S]``, read as ``view4`` if given: a bias given ``[B * H, l, S]``), ``masked_fill(scores,
    other, value)`` or ``tanh(scores)``."""

    target: object
    other: Union[None, float, torch.fx.Node] = None
    value: Optional[float] = None
    view4: Optional[tuple] = None


@dataclass(frozen=True)
class Layout:
    """The grouped attention's sizes: scores ``[batch * kv_heads, groups * rows, cache]``."""

    batch: int
    kv_heads: int
    groups: int
    rows: object          # an int, or the step's dynamic length
    cache: int

    @property
    def heads(self) -> int:
        return self.kv_heads * self.groups

    def lead4(self, shape) -> tuple:
        """A tensor's shape padded to ``[b, h, l, s]``."""
        return tuple([1] * (4 - len(shape)) + list(shape))

    def needs_four_dims(self, shape4) -> bool:
        """Whether a tensor ``[b, h, l, s]`` is added to the scores viewed
        ``[B * Hkv, G, L, S]`` (rather than as ``[B * Hkv, G * L, S]``)."""
        _, h, l, _ = shape4
        return self.groups > 1 and not (_one(h) and _one(l))

    def view_of(self, shape4, four: bool) -> list:
        """The shape a tensor ``[b, h, l, s]`` is read as beside the scores."""
        b, h, l, s = shape4
        if _one(h):
            return [l, s]
        if four:
            return [b * self.kv_heads, self.groups, l, s]
        return [b * h, l, s]


def _one(size) -> bool:
    return isinstance(size, int) and size == 1


def operand(emit: Emitter, node: torch.fx.Node, shape4: tuple, layout: Layout, four: bool
            ) -> torch.fx.Node:
    """``node`` (a tensor ``shape4`` broadcasts to ``[B, H, L, S]``) as it is added to the
    grouped scores."""
    shape = layout.view_of(shape4, four)
    if list(tensor_val(node).shape) == shape:
        return node
    return emit(aten.reshape.default, node, reshape_arg(shape))


def _fill_parts(emit: Emitter, mask: torch.fx.Node, value: float, dtype) -> tuple:
    """(keep, fill) of ``masked_fill(·, mask, value)``: ``1 - mask`` and ``value`` where
    ``mask`` else 0, in ``dtype``."""
    keep = emit(aten.to.dtype, emit(aten.logical_not.default, mask), dtype)
    fill = emit(aten.where.self, mask,
                emit(aten.scalar_tensor.default, value, dtype=dtype),
                emit(aten.scalar_tensor.default, 0.0, dtype=dtype))
    return keep, fill


def _describe(op) -> str:
    name = op.target.__name__.split(".")[0]
    if op.other is None:
        return name
    other = op.other.name if isinstance(op.other, torch.fx.Node) else f"{op.other:g}"
    if op.target is aten.masked_fill.Scalar:
        return f"masked_fill({other}, {op.value:g})"
    return f"{name} {other}"


def apply_ops(emit: Emitter, scores: torch.fx.Node, ops: tuple, layout: Layout) -> tuple:
    """(the scores after ``ops``, as ``[B * Hkv, G * L, S]``; what was done): each op on the
    grouped scores, tensors read as :func:`operand` says."""
    dtype = tensor_val(scores).dtype
    shapes = {id(op): (op.view4 or layout.lead4(tensor_val(op.other).shape))
              for op in ops if isinstance(op.other, torch.fx.Node)}
    four = any(layout.needs_four_dims(s) for s in shapes.values())
    flat = [layout.batch * layout.kv_heads, layout.groups * layout.rows, layout.cache]
    grouped = [layout.batch * layout.kv_heads, layout.groups, layout.rows, layout.cache]
    if four:
        scores = emit(aten.reshape.default, scores, reshape_arg(grouped))
    for op in ops:
        other = op.other
        if isinstance(other, torch.fx.Node):
            other = operand(emit, other, shapes[id(op)], layout, four)
        if op.target is aten.tanh.default:
            scores = emit(aten.tanh.default, scores)
        elif op.target is aten.masked_fill.Scalar:
            keep, fill = _fill_parts(emit, other, op.value, dtype)
            scores = emit(aten.add.Tensor, emit(aten.mul.Tensor, scores, keep), fill)
        elif not (op.target in _TIMES and other == 1.0):     # x * 1 and x / 1 are x
            target = {aten.mul.Scalar: aten.mul.Tensor, aten.div.Scalar: aten.div.Tensor,
                      aten.add.Scalar: aten.add.Tensor}.get(op.target, op.target)
            scores = emit(target, scores, other)
    if four:
        scores = emit(aten.reshape.default, scores, reshape_arg(flat))
    return scores, ", ".join(_describe(op) for op in ops)


def why_not_operands(ops, q, cache: int) -> Optional[str]:
    """Why a tensor an op reads does not broadcast to ``[B, H, L, S]`` as the grouped rewrite
    reads it (``[b, h, l, s]``: b the batch or 1, h H or 1, l L or 1, s S or 1)."""
    batch, heads, rows = q.shape[:3]
    for op in ops:
        if not isinstance(op.other, torch.fx.Node):
            continue
        v = tensor_val(op.other)
        fill = op.target is aten.masked_fill.Scalar
        if v is None or v.dim() > 4 or v.dtype != (torch.bool if fill else q.dtype):
            return f"{op.other.name}: not a {'bool' if fill else q.dtype} tensor of 4 dims " \
                   "at most"
        b, h, l, s = op.view4 or (1,) * (4 - v.dim()) + tuple(v.shape)
        fits = all(same_size(x, 1) or same_size(x, full) for x, full in
                   ((b, batch), (h, heads), (l, rows), (s, cache)))
        if not fits or not (same_size(b, batch) or (same_size(h, 1) and same_size(b, 1))):
            return f"{op.other.name} of shape {tuple(v.shape)} is not read as [B or 1, H or " \
                   f"1, L or 1, S] with a batch of {batch}"
    return None
