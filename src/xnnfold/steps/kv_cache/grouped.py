"""Attention over a KV cache in ops XNNPACK takes, without repeating the cache (the default:
any runtime with XNNPACK and the portable kernels runs it).

Grouped-query attention repeats each of the ``Hkv`` cached heads for the ``G`` query heads that
share it (transformers' ``repeat_kv``, executorch's ``repeat_interleave``): on portable, an
``expand_copy`` of the whole cache per layer and step, and an ``unsqueeze_copy`` before it. Query
head ``h`` reads KV head ``h // G`` in both, so the ``G`` query heads of a KV head are ``G`` more
*rows* of one matrix product with that head's cache: ``q [B, H, L, D]`` reshaped to
``[B * Hkv, G * L, D]`` multiplies the cache ``[B * Hkv, S, D]`` as it is, the same products and
sums as the repeated form, with nothing repeated.

An SDPA's mask is turned into an additive one once per program (every layer shares it): on
portable, on the mask's own ``[L, S]`` (or ``[H, L, S]``, per head). Where
:func:`.positions.prove_mask` proved that no row is fully blocked (causal from the cache
position, within a sliding window, or no row all -inf), the plain softmax is the safe one;
otherwise fully blocked rows are handled as the attention step does (unblocked, then multiplied
by a 0/1 keep factor: eager gives 0 there). An eager attention (:mod:`.eager`) gets its own ops
on the scores, in its order (:mod:`.scores`), and eager's plain softmax.
"""

from __future__ import annotations

import torch
import torch.fx

from ...graph.emit import Emitter, reshape_arg, reshape_source
from ...graph.node_meta import tensor_val
from ...graph.sdpa import mask_parts
from . import scores as grouped_scores
from . import visible as cut
from .pattern import CacheAttention

aten = torch.ops.aten
EAGER = "eager attention"


class MaskParts:
    """What the rewrites of one program build from a mask or a bias once, before its first
    use: the additive mask and keep factor of each SDPA mask, each tensor's grouped view."""

    def __init__(self):
        self._parts: dict = {}

    def memo(self, key, build) -> tuple:
        """``build()`` (a tuple of nodes, or of None) the first time ``key`` is asked for."""
        if key not in self._parts:
            self._parts[key] = build()
        return self._parts[key]

    def get(self, emit: Emitter, mask: torch.fx.Node, dtype: torch.dtype, proven: bool) -> tuple:
        return self.memo((mask, proven), lambda: mask_parts(emit, mask, dtype, bool(proven)))

    def forget(self, erased: set) -> None:
        self._parts = {k: parts for k, parts in self._parts.items()
                       if not any(p in erased for p in parts if p is not None)}


def rewrite(emit: Emitter, attention: CacheAttention, masks: MaskParts, proven,
            key: torch.fx.Node = None, value: torch.fx.Node = None,
            visible: torch.fx.Node = None) -> str:
    """Replace ``attention.sdpa`` by the grouped computation; return how the mask was taken.
    ``key`` and ``value``: the caches as ``[B * Hkv, S, D]`` (default: the updated caches,
    reshaped). ``proven``: what :func:`.positions.prove_mask` proved of an SDPA's mask (its
    text), or False. ``visible``: the rows the step can see (:mod:`.visible`), or None to
    attend over every cache row."""
    q = attention.query
    batch, heads, rows, dim = tensor_val(q).shape
    groups, cache = attention.groups, attention.key.shape[2]
    layout = grouped_scores.Layout(batch, heads // groups, groups, rows, cache)
    bh = batch * layout.kv_heads

    def reshape(x, shape):
        return reshape_source(x, shape) or emit(aten.reshape.default, x, reshape_arg(shape))

    eager = attention.scores is not None
    # SDPA scales the query; an eager attention scales the scores, in its own ops
    q3 = reshape(q if eager else emit(aten.mul.Tensor, q, attention.scale),
                 [bh, groups * rows, dim])
    k3 = key if key is not None else reshape(attention.key.node, [bh, cache, dim])
    v3 = value if value is not None else reshape(attention.value.node,
                                                 [bh, cache, attention.value_dim])
    if visible is not None:
        k3, v3 = cut.rows(emit, k3, visible), cut.rows(emit, v3, visible)
    # q @ K^T with K^T as the right operand: XNNPACK packs the right operand of a bmm on every
    # run anyway (taking the transpose with it); the cache as the left operand, K @ q^T, with
    # only G * L columns, measured slower (0.157 against 0.119 ms, 2,048 rows, 2 KV heads)
    scores = emit(aten.bmm.default, q3, emit(aten.transpose.int, k3, 1, 2))
    keep, how = None, "no mask"
    if eager:
        scores, ops = grouped_scores.apply_ops(emit, scores, attention.scores, masks, layout)
        how = f"{EAGER}: {ops or 'no op'} on the scores as eager computes them, then its softmax"
    elif attention.mask is not None:
        if visible is None:
            additive, keep = masks.get(emit, attention.mask, tensor_val(q).dtype, bool(proven))
            scores = _add_mask(emit, reshape, scores, additive, layout, masks)
            how = _mask_how(proven)
        else:
            scores = emit(aten.add.Tensor, scores, cut.mask(
                emit, masks, attention.key.positions, visible, groups, proven,
                tensor_val(q).dtype))
            how = f"{_mask_how(proven)}; {cut.HOW}"
    weights = emit(aten.softmax.int, scores, -1)
    out = reshape(emit(aten.bmm.default, weights, v3),
                  list(tensor_val(attention.sdpa).shape))
    if keep is not None:
        out = emit(aten.mul.Tensor, out, keep)
    attention.sdpa.replace_all_uses_with(out)
    emit.graph.erase_node(attention.sdpa)
    for node in attention.between:      # an eager attention's own ops (dropout is never DCE'd)
        emit.graph.erase_node(node)
    return how


def _mask_how(proven) -> str:
    from .positions import CAUSAL

    if not proven:
        return "fully blocked rows handled by a keep factor"
    if proven is True or proven == CAUSAL:
        return "mask proven causal: no fully blocked row"
    return f"mask proven {proven}: no fully blocked row"


def _add_mask(emit, reshape, scores, additive, layout, masks):
    """``scores [B * Hkv, G * L, S]`` plus the mask: shared by the heads (leading dims 1),
    per head (:mod:`.scores`), or per batch and shared by the heads."""
    lead = layout.lead4(tensor_val(additive).shape)
    batch, kv_heads, groups, rows, cache = (layout.batch, layout.kv_heads, layout.groups,
                                            layout.rows, layout.cache)
    if lead[0] != 1 and lead[1] == 1:   # per batch: [B, Hkv, G, L, S] + [B, 1, 1, Lm, S]
        scores5 = reshape(scores, [batch, kv_heads, groups, rows, cache])
        summed = emit(aten.add.Tensor, scores5,
                      reshape(additive, [batch, 1, 1, lead[2], cache]))
        return reshape(summed, [batch * kv_heads, groups * rows, cache])
    four = layout.needs_four_dims(lead)
    mask = grouped_scores.operand(emit, masks, additive, lead, layout, four)
    if not four:
        return emit(aten.add.Tensor, scores, mask)
    scores4 = reshape(scores, [batch * kv_heads, groups, rows, cache])
    return reshape(emit(aten.add.Tensor, scores4, mask), [batch * kv_heads, groups * rows, cache])
