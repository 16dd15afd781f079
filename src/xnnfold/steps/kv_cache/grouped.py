"""Attention over a KV cache in ops XNNPACK takes, without repeating the cache (the default:
any runtime with XNNPACK and the portable kernels runs it).

Grouped-query attention repeats each of the ``Hkv`` cached heads for the ``G`` query heads that
share it (transformers' ``repeat_kv``, executorch's ``repeat_interleave``): on portable, an
``expand_copy`` of the whole cache per layer and step, and an ``unsqueeze_copy`` before it. Query
head ``h`` reads KV head ``h // G`` in both, so the ``G`` query heads of a KV head are ``G`` more
*rows* of one matrix product with that head's cache: ``q [B, H, L, D]`` reshaped to
``[B * Hkv, G * L, D]`` multiplies the cache ``[B * Hkv, S, D]`` as it is, the same products and
sums as the repeated form, with nothing repeated.

An SDPA's mask is turned into an additive one once per program (every layer shares it: the
step merges the repeats, :func:`xnnfold.graph.sdpa.merge_mask_repeats`): on portable, on the
mask's own ``[L, S]`` (or ``[H, L, S]``, per head). Where :func:`.mask_proof.prove_mask`
proved that no row is fully blocked (causal from the cache position, within a sliding window, or
no row all -inf), the plain softmax is the safe one; otherwise fully blocked rows are handled as
the attention step does (unblocked, then multiplied by a 0/1 keep factor: eager gives 0 there).
An eager attention (:mod:`.eager`) gets its own ops on the scores, in its order (:mod:`.scores`),
and eager's plain softmax.
"""

from __future__ import annotations

import torch
import torch.fx

from ...graph.emit import Emitter
from ...graph.node_meta import tensor_val
from ...graph.sdpa import mask_parts, reshaper
from . import scores as grouped_scores
from . import visible as cut
from .plan import CAUSAL, Plan

aten = torch.ops.aten
EAGER = "eager attention"
# Besides SDPA's own mask ops (:data:`xnnfold.graph.sdpa.MASK_OPS`), the ops of the mask views
# (:func:`.scores.operand`) and of the mask over the visible rows (:func:`.visible.mask`): pure,
# merged where they repeat (every layer reads the same mask)
MASK_VIEW_OPS = frozenset({
    aten.reshape.default, aten.repeat.default, aten.arange.default, aten.unsqueeze.default,
    aten.le.Tensor, aten.gt.Tensor, aten.sub.Tensor, aten.logical_and.default,
})


def rewrite(emit: Emitter, plan: Plan, key: torch.fx.Node = None, value: torch.fx.Node = None,
            visible: torch.fx.Node = None) -> str:
    """Replace ``plan.attention`` by the grouped computation under what ``plan.proof`` says of
    its mask; return how the mask was taken. ``key`` and ``value``: the caches as ``[B * Hkv,
    S, D]`` (default: the updated caches, reshaped). ``visible``: the rows the step can see
    (:mod:`.visible`), or None to attend over every cache row."""
    attention, proof = plan.attention, plan.proof
    q = attention.query
    batch, heads, rows, dim = tensor_val(q).shape
    groups, cache = attention.groups, attention.key.shape[2]
    layout = grouped_scores.Layout(batch, heads // groups, groups, rows, cache)
    bh = batch * layout.kv_heads

    reshape = reshaper(emit)
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
    # only G * L columns, measured slower: 0.157 against 0.119 ms (2,048 rows, 2 KV heads);
    # at decode 1.42-1.60x at 161 rows, 1.01-1.26x at 1,000 (3 KV heads x 3 and 8 x 4), and
    # 1.4-4.5x with V^T @ P^T as well (docs/llm.md, the KV-cache step)
    scores = emit(aten.bmm.default, q3, emit(aten.transpose.int, k3, 1, 2))
    keep, how = None, "no mask"
    if eager:
        scores, ops = grouped_scores.apply_ops(emit, scores, attention.scores, layout)
        how = f"{EAGER}: {ops or 'no op'} on the scores as eager computes them, then its softmax"
    elif attention.mask is not None:
        if visible is None:
            additive, keep = mask_parts(emit, attention.mask, tensor_val(q).dtype,
                                        proven=proof is not None)
            scores = _add_mask(emit, reshape, scores, additive, layout)
            how = _mask_how(proof)
        else:
            scores = emit(aten.add.Tensor, scores, cut.mask(
                emit, attention.key.positions, visible, groups, proof, tensor_val(q).dtype))
            how = f"{_mask_how(proof)}; {cut.HOW}"
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


def _mask_how(proof) -> str:
    if proof is None:
        return "fully blocked rows handled by a keep factor"
    if proof == CAUSAL:
        return "mask proven causal: no fully blocked row"
    return f"mask proven {proof.text}: no fully blocked row"


def _add_mask(emit, reshape, scores, additive, layout):
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
    mask = grouped_scores.operand(emit, additive, lead, layout, four)
    if not four:
        return emit(aten.add.Tensor, scores, mask)
    scores4 = reshape(scores, [batch * kv_heads, groups, rows, cache])
    return reshape(emit(aten.add.Tensor, scores4, mask), [batch * kv_heads, groups * rows, cache])
