"""Why an attention over two updated caches (:class:`.pattern.CacheUpdate`) is not one the
grouped rewrite takes: the caches and the query (:func:`why_not_cache_pair`, for SDPA and eager
attention alike) and an SDPA's own arguments (:func:`why_not_sdpa`)."""

from __future__ import annotations

from typing import Optional

import torch

from ...analysis import dequantized
from ...graph.node_meta import tensor_val
from ...graph.sdpa import why_not_dropout, why_not_mask


def why_not_sdpa(a: dict, q, key, value, gk: int, gv: int
                 ) -> Optional[str]:
    """Why an SDPA (its arguments ``a``) over two updated caches is not taken, or None."""
    if (reason := why_not_dropout(a)) is not None:
        return reason
    if a["is_causal"]:
        return "is_causal=True over a cache (top-left aligned): not a decode attention"
    reason = why_not_cache_pair(q, key, value, gk, gv, (a["query"],)) or why_not_mask(a, q)
    if reason:
        return reason
    b, s = key.shape[0], key.shape[2]
    mask = a["attn_mask"]
    if mask is not None:
        m = tensor_val(mask)
        lead = [1] * (4 - m.dim()) + list(m.shape)
        if lead[1] not in (1, q.shape[1]) or lead[0] not in (1, b) or lead[3] != s:
            return f"a mask of shape {tuple(m.shape)} does not broadcast to [{b}, " \
                   f"{q.shape[1]}, L, {s}]"
        if lead[1] != 1 and lead[0] != b:
            return f"a per-head mask of shape {tuple(m.shape)} for a batch of {b}"
    return None


def why_not_cache_pair(q, key, value, gk: int, gv: int,
                       inputs: tuple = ()) -> Optional[str]:
    """Why a query ``q`` ``[B, H, L, D]`` and two updated caches are not an attention the
    grouped rewrite takes (fp32, static batch, heads and cache, the heads paired, the query's
    head size the key's; the value's may differ), or None."""
    if q.dtype != torch.float32 or any(tensor_val(u.buffer).dtype != torch.float32
                                      for u in (key, value)):
        return f"dtype {q.dtype}: the rewrite is for fp32 caches"
    if q.dim() != 4:
        return f"a {q.dim()}-D query, not [B, H, L, D]"
    if any(dequantized(x) for x in inputs + (key.rows, value.rows)):
        return ("q, k or v is dequantized (static int8): XNNPACK would take the attention's "
                "ops as quantized ones")
    (b, hkv, s, d), (vb, vh, vs, vd) = key.shape, value.shape
    if (b, hkv, s) != (vb, vh, vs) or gk != gv or gk < 1 or q.shape[1] != hkv * gk:
        return (f"key cache {key.shape}, value cache {value.shape} and {q.shape[1]} query heads "
                f"do not pair (groups {gk} and {gv})")
    if key.node is value.node:
        return "key and value read the same cache"
    if not all(isinstance(x, int) for x in (b, hkv, s, d, vd, q.shape[0], q.shape[1])):
        return "dynamic batch, head or cache sizes"
    if q.shape[0] != b or q.shape[-1] != d:
        return f"query {tuple(q.shape)} does not match the key cache {key.shape}"
    return None
