"""``scaled_dot_product_attention`` as the steps read it, and what they build around its mask:
written once for the attention step and the KV-cache step.

- :func:`sdpa_args` — the call's arguments by name, defaults filled in;
- :func:`mask_parts` — a mask (bool, True = take part, or additive float) turned into the
  additive mask the rewritten attention adds to its scores, and, unless the mask is proven to
  leave every row at least one column, a 0/1 keep factor per row. A plain softmax differs from
  SDPA's safe one only on a row whose logits are all ``-inf``: such rows are unblocked (their
  additive mask set to 0, so the softmax stays finite) and the output multiplied by the keep
  factor, so that they give 0, as eager gives. Both are computed on the mask's own size.
"""

from __future__ import annotations

import torch
import torch.fx

from .emit import Emitter
from .node_meta import tensor_val

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
             "enable_gqa": False}


def sdpa_args(node: torch.fx.Node) -> dict:
    """The SDPA call's arguments by name, defaults filled in."""
    return {**_DEFAULTS, **dict(zip(_ARGS, node.args)), **node.kwargs}


def mask_parts(emit: Emitter, mask: torch.fx.Node, dtype: torch.dtype, proven: bool = False
               ) -> tuple:
    """(additive float mask, keep factor or None): see the module's docstring. ``proven``: the
    mask is known to block no row entirely (a causal mask proven from the cache position), so
    no keep factor is needed."""
    additive = mask
    if tensor_val(mask).dtype == torch.bool:
        # The bool mask is read once, by ``where``, as stock's decomposition reads it: a byte
        # other than 0 or 1 (an uninitialized buffer: executorch's llama example materializes
        # its causal mask with ``to_empty``) is True there, as in eager, whereas the runtime's
        # logical ops and casts would take its bits as they are (``logical_not`` of 0x5A is
        # 0x5B, its cast to float 90.0).
        additive = emit(aten.where.self, mask,
                        emit(aten.scalar_tensor.default, 0.0, dtype=dtype),
                        emit(aten.scalar_tensor.default, float("-inf"), dtype=dtype))
    if proven:
        return additive, None
    alive = emit(aten.any.dim, emit(aten.ne.Scalar, additive, float("-inf")), -1, True)
    additive = emit(aten.masked_fill.Scalar, additive, emit(aten.logical_not.default, alive), 0.0)
    return additive, emit(aten.to.dtype, alive, dtype)
