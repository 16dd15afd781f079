"""``scaled_dot_product_attention`` rewritten into ops XNNPACK takes.

``run_decompositions`` turns each ``aten.scaled_dot_product_attention`` into ``mul.Scalar`` on
q and k, ``expand`` + ``view`` around two ``bmm``, and a *safe* softmax (``eq(s, -inf)``,
``logical_not``, ``any``, ``full_like``, ``where``) over the whole ``[..., L, S]`` score tensor.
XNNPACK 1.5.1 takes the ``bmm`` and the softmax but none of the glue, so every attention splits
into three delegates with the glue on portable kernels (whisper-tiny's encoder: 60% of its time).

This step writes the same math with ``mul.Tensor`` by a Python float (XNNPACK takes it, unlike
``mul.Scalar``), ``reshape`` to 3-D, ``transpose``, ``bmm``, ``add`` and a plain ``softmax``.
A plain softmax differs from the safe one only on a row whose logits are all ``-inf``; for
finite q and k that happens only where a mask blocks the whole row:

- no mask, ``is_causal=False``: no such row;
- ``is_causal=True``: torch's causal mask is top-left aligned (row i keeps columns 0..i), so
  every row keeps column 0; the ``[L, S]`` mask is built on portable, as stock builds it;
- a mask (bool, True = take part, or additive float): which rows it blocks entirely is computed
  on the mask itself (its own size, not ``[..., L, S]``), those rows are unblocked so the
  softmax stays finite, and the output is multiplied by a 0/1 keep factor: such a row gives 0,
  as eager gives.

An attention XNNPACK would not take whole in this form (dtype, dropout, broadcast batch dims,
dynamic sizes) is left exactly as it was, and says why. q, k and v dequantized from int8
(a PT2E program) are rewritten alike: see :mod:`.quantized`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx

from . import quantized
from ...graph.node_meta import tensor_val
from ...graph.emit import MAX_RANK, Emitter, reshape_arg, static_shape
from ...graph.sdpa import (causal_mask, mask_parts, reshaper, scale_of, sdpa_args,
                           why_not_dropout, why_not_mask)
from .restride import replace_uses

aten = torch.ops.aten

NO_MASK = "no mask"
CAUSAL = "causal, no empty row"
KEEP_FACTOR = "mask: fully-masked rows handled by keep factor"


def why_kept(node: torch.fx.Node) -> Optional[str]:
    """Why this SDPA is left as it was, or None if the rewrite applies and XNNPACK takes all
    its ops (fp32; one batch shape for q, k and v, static, of rank 1 to 4; every reshape with
    at most one dynamic dim, written -1)."""
    a = sdpa_args(node)
    q, k, v = (tensor_val(a[n]) for n in ("query", "key", "value"))
    if q is None or k is None or v is None:
        return "q, k or v has no tensor metadata"
    if (reason := why_not_dropout(a)) is not None:
        return reason
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return f"dtype {q.dtype}: XNNPACK's bmm and softmax are taken in fp32 only"
    if not 3 <= q.dim() <= MAX_RANK or k.dim() != q.dim() or v.dim() != q.dim():
        return f"ranks {q.dim()}, {k.dim()}, {v.dim()}: bmm needs one batch shape of rank 1-4"
    if not static_shape(q.shape[:-2]) or not static_shape([q.shape[-1], v.shape[-1]]):
        return "dynamic batch or head sizes: XNNPACK takes no reshape to a symbolic shape"
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        return (f"batch shapes {tuple(q.shape[:-2])}, {tuple(k.shape[:-2])}, "
                f"{tuple(v.shape[:-2])} differ (broadcast or grouped-query attention)")
    if k.shape[-1] != q.shape[-1] or 0 in q.shape or 0 in k.shape or 0 in v.shape:
        return "empty or mismatched q, k, v sizes"
    mask = a["attn_mask"]
    if mask is not None:
        if a["is_causal"]:
            return "both attn_mask and is_causal"
        if (reason := why_not_mask(a, q)) is not None:
            return reason
        m = tensor_val(mask)
        mask_3d = _mask_3d(q, m)
        reshaped = list(q.shape)[:-1] + [k.shape[-2]] if mask_3d is None else \
            mask_3d if m.dim() > 3 else []
        if reshape_arg(reshaped) is None:
            return ("dynamic L and S with a mask: the reshape around it would have two "
                    "dynamic dims, which XNNPACK does not take")
    return None


def _mask_3d(q: torch.Tensor, m: torch.Tensor) -> Optional[list]:
    """The 3-D shape ``[1 or batch, Lm, Sm]`` the mask takes without an expand, if any: its
    batch dims (right-aligned) all 1, or all equal to q's."""
    lead = list(q.shape[:-2])
    mask_lead = [1] * (len(lead) + 2 - m.dim()) + list(m.shape[:-2])
    if all(d == 1 for d in mask_lead):
        return [1] + list(m.shape[-2:])
    if mask_lead == lead:
        return [math.prod(lead)] + list(m.shape[-2:])
    return None


def rewrite_one(emit: Emitter, node: torch.fx.Node) -> str:
    """Replace ``node`` (an SDPA that :func:`why_kept` accepts) by the explicit computation;
    return what was proven about its masked rows."""
    a = sdpa_args(node)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    qv, kv, vv = tensor_val(q), tensor_val(k), tensor_val(v)
    lead, (L, E), S, Ev = list(qv.shape[:-2]), qv.shape[-2:], kv.shape[-2], vv.shape[-1]
    batch = math.prod(lead)
    scale = scale_of(a, E)

    additive, keep, proven = None, None, NO_MASK
    if mask is not None:
        additive, keep = mask_parts(emit, mask, qv.dtype)
        proven = KEEP_FACTOR
    elif a["is_causal"]:
        # A dynamic size is read from q / k at run time, as stock's causal mask reads it.
        rows = L if isinstance(L, int) else emit(aten.sym_size.int, q, qv.dim() - 2)
        cols = S if isinstance(S, int) else emit(aten.sym_size.int, k, kv.dim() - 2)
        additive, proven = causal_mask(emit, rows, cols, qv.dtype), CAUSAL

    reshape = reshaper(emit)
    q3 = reshape(emit(aten.mul.Tensor, q, scale), [batch, L, E])
    k3 = emit(aten.transpose.int, reshape(k, [batch, S, E]), 1, 2)
    scores = emit(aten.bmm.default, q3, k3)                           # [batch, L, S]
    mask_3d = _mask_3d(qv, tensor_val(additive)) if additive is not None else None
    if additive is not None and mask_3d is None:
        # A mask broadcast over some batch dims only: added to the scores in q's rank.
        scores = emit(aten.add.Tensor, reshape(scores, lead + [L, S]), additive)
        scores = reshape(scores, [batch, L, S])
    elif additive is not None:
        if tensor_val(additive).dim() > 3:   # lower ranks broadcast onto [batch, L, S] as they are
            additive = reshape(additive, mask_3d)
        scores = emit(aten.add.Tensor, scores, additive)
    weights = emit(aten.softmax.int, scores, -1)
    out = reshape(emit(aten.bmm.default, weights, reshape(v, [batch, S, Ev])), lead + [L, Ev])
    if keep is not None:
        out = emit(aten.mul.Tensor, out, keep)
    replace_uses(node, out)      # the users' strides kept traceable
    emit.graph.erase_node(node)
    return quantized.note(proven, (q, k, v))
