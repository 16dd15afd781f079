"""Attention over a KV cache in ops XNNPACK takes, without repeating the cache (the default:
any runtime with XNNPACK and the portable kernels runs it).

Grouped-query attention repeats each of the ``Hkv`` cached heads for the ``G`` query heads that
share it (transformers' ``repeat_kv``, executorch's ``repeat_interleave``): on portable, an
``expand_copy`` of the whole cache per layer and step, and an ``unsqueeze_copy`` before it. Query
head ``h`` reads KV head ``h // G`` in both, so the ``G`` query heads of a KV head are ``G`` more
*rows* of one matrix product with that head's cache: ``q [B, H, L, D]`` reshaped to
``[B * Hkv, G * L, D]`` multiplies the cache ``[B * Hkv, S, D]`` as it is, the same products and
sums as the repeated form, with nothing repeated.

The mask is turned into an additive one once per program (every layer shares it): on portable,
on the mask's own ``[L, S]``. Where :func:`.positions.prove_mask` proved it causal from the
cache position, every row attends at least column 0 and the plain softmax is the safe one;
otherwise fully blocked rows are handled as the attention step does (unblocked, then multiplied
by a 0/1 keep factor: eager gives 0 there).
"""

from __future__ import annotations

import torch
import torch.fx

from ...graph.emit import Emitter, reshape_arg, reshape_source
from ...graph.node_meta import tensor_val
from ...graph.sdpa import mask_parts
from .pattern import CacheAttention

aten = torch.ops.aten


class MaskParts:
    """The additive mask and keep factor of each mask node, built once, before its first use."""

    def __init__(self):
        self._parts: dict = {}

    def get(self, emit: Emitter, mask: torch.fx.Node, dtype: torch.dtype, proven: bool) -> tuple:
        key = (mask, proven)
        if key not in self._parts:
            self._parts[key] = mask_parts(emit, mask, dtype, proven)
        return self._parts[key]

    def forget(self, erased: set) -> None:
        self._parts = {k: parts for k, parts in self._parts.items()
                       if not any(p in erased for p in parts if p is not None)}


def rewrite(emit: Emitter, attention: CacheAttention, masks: MaskParts, proven: bool,
            key: torch.fx.Node = None, value: torch.fx.Node = None) -> str:
    """Replace ``attention.sdpa`` by the grouped computation; return how the mask was taken.
    ``key`` and ``value``: the caches as ``[B * Hkv, S, D]`` (default: the updated caches,
    reshaped)."""
    q = attention.query
    batch, heads, rows, dim = tensor_val(q).shape
    groups, cache = attention.groups, attention.key.shape[2]
    kv_heads = heads // groups
    bh = batch * kv_heads

    def reshape(x, shape):
        return reshape_source(x, shape) or emit(aten.reshape.default, x, reshape_arg(shape))

    q3 = reshape(emit(aten.mul.Tensor, q, attention.scale), [bh, groups * rows, dim])
    k3 = key if key is not None else reshape(attention.key.node, [bh, cache, dim])
    v3 = value if value is not None else reshape(attention.value.node, [bh, cache, dim])
    # q @ K^T with K^T as the right operand: XNNPACK packs the right operand of a bmm on every
    # run anyway (taking the transpose with it); the cache as the left operand, K @ q^T, with
    # only G * L columns, measured slower (0.157 against 0.119 ms, 2,048 rows, 2 KV heads)
    scores = emit(aten.bmm.default, q3, emit(aten.transpose.int, k3, 1, 2))
    keep, how = None, "no mask"
    if attention.mask is not None:
        additive, keep = masks.get(emit, attention.mask, tensor_val(q).dtype, proven)
        scores = _add_mask(emit, reshape, scores, additive, batch, kv_heads, groups, rows, cache)
        how = "mask proven causal: no fully blocked row" if proven else \
            "fully blocked rows handled by a keep factor"
    weights = emit(aten.softmax.int, scores, -1)
    out = reshape(emit(aten.bmm.default, weights, v3), [batch, heads, rows, dim])
    if keep is not None:
        out = emit(aten.mul.Tensor, out, keep)
    attention.sdpa.replace_all_uses_with(out)
    emit.graph.erase_node(attention.sdpa)
    return how


def _add_mask(emit, reshape, scores, additive, batch, kv_heads, groups, rows, cache):
    """``scores [B * Hkv, G * L, S]`` plus the mask (leading dims 1, or the batch), broadcast
    over the groups of each KV head."""
    m = tensor_val(additive)
    lead = [1] * (4 - m.dim()) + list(m.shape)
    mask_rows = lead[2]
    if lead[0] != 1:        # a per-batch mask: [B, Hkv, G, L, S] + [B, 1, 1, Lm, S]
        scores5 = reshape(scores, [batch, kv_heads, groups, rows, cache])
        summed = emit(aten.add.Tensor, scores5,
                      reshape(additive, [batch, 1, 1, mask_rows, cache]))
        return reshape(summed, [batch * kv_heads, groups * rows, cache])
    mask2 = reshape(additive, [mask_rows, cache]) if m.dim() != 2 else additive
    if isinstance(mask_rows, int) and mask_rows == 1:
        return emit(aten.add.Tensor, scores, mask2)
    scores4 = reshape(scores, [batch * kv_heads, groups, rows, cache])
    return reshape(emit(aten.add.Tensor, scores4, mask2), [batch * kv_heads, groups * rows, cache])
