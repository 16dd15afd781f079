"""``scaled_dot_product_attention`` as the steps read it, and what they build around it: written
once for the attention step and the KV-cache step.

- :func:`sdpa_args` — the call's arguments by name, defaults filled in; :func:`scale_of` — its
  scale (SDPA's default ``1 / sqrt(E)``);
- :func:`why_not_dropout`, :func:`why_not_mask` — the argument checks both rewrites make;
- :func:`reshaper` — a reshape XNNPACK takes (a reshape back to a shape the tensor came with
  reads that tensor; otherwise at most one dynamic dim, written -1);
- :func:`mask_parts` — a mask (bool, True = take part, or additive float) turned into the
  additive mask the rewritten attention adds to its scores, and, unless the mask is proven to
  leave every row at least one column, a 0/1 keep factor per row. A plain softmax differs from
  SDPA's safe one only on a row whose logits are all ``-inf``: such rows are unblocked (their
  additive mask set to 0, so the softmax stays finite) and the output multiplied by the keep
  factor, so that they give 0, as eager gives. Both are computed on the mask's own size;
  :func:`causal_mask` — torch's top-left causal mask, built at run time as stock builds it;
- :func:`merge_mask_repeats` — what the rewrites build from a mask, computed once per program.
  Every attention of a transformers encoder or decoder reads the same mask, and a causal
  attention's mask depends only on its sizes: each rewrite emits its own mask bookkeeping (on
  portable), and the nodes that apply the same pure op to the same values are then merged into
  the first one (graph order, so before every user of the others). Portable's ``where`` alone
  costs about 18 ns per mask element (measured: BERT, 4 layers, 128 tokens, 1.15 ms per run).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.fx

from . import values
from .emit import Emitter, reshape_arg, reshape_source
from .node_meta import tensor_val

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
             "enable_gqa": False}
# The ops of the mask bookkeeping (mask_parts, causal_mask, and the KV-cache step's views of a
# mask and its mask over the visible rows): pure, no randomness.
MASK_OPS = frozenset({
    aten.where.self, aten.scalar_tensor.default, aten.ne.Scalar, aten.any.dim,
    aten.logical_not.default, aten.masked_fill.Scalar, aten.to.dtype, aten.tril.default,
    aten.ones.default, aten.zeros.default, aten.sym_size.int,
})


def sdpa_args(node: torch.fx.Node) -> dict:
    """The SDPA call's arguments by name, defaults filled in."""
    return {**_DEFAULTS, **dict(zip(_ARGS, node.args)), **node.kwargs}


def scale_of(args: dict, head_dim: int) -> float:
    """The factor SDPA scales ``q k^T`` by: its ``scale``, or ``1 / sqrt(head_dim)``."""
    return args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(head_dim)


def why_not_dropout(args: dict) -> Optional[str]:
    """Why an SDPA's dropout keeps it as it is (a random draw is not rewritten), or None."""
    if args["dropout_p"] != 0.0:
        return f"dropout_p={args['dropout_p']}: random, not rewritten"
    return None


def why_not_mask(args: dict, q: torch.Tensor) -> Optional[str]:
    """Why the rewrites do not read an SDPA's ``attn_mask`` (of the query ``q``), or None: a
    bool or q-dtype mask of q's rank at most."""
    mask = args["attn_mask"]
    if mask is None:
        return None
    m = tensor_val(mask)
    if m is None or m.dim() > q.dim() or m.dtype not in (torch.bool, q.dtype):
        return "attn_mask of another dtype than bool or q's, or of a higher rank than q's"
    return None


def reshaper(emit: Emitter) -> Callable:
    """``reshape(x, shape)``: ``x``'s source where ``x`` was reshaped from that shape, else a
    reshape ``emit`` makes, its one dynamic dim written -1 (:func:`.emit.reshape_arg`)."""
    def reshape(x: torch.fx.Node, shape) -> torch.fx.Node:
        return reshape_source(x, shape) or emit(aten.reshape.default, x, reshape_arg(shape))
    return reshape


def causal_mask(emit: Emitter, rows, cols, dtype: torch.dtype) -> torch.fx.Node:
    """Additive top-left causal mask [rows, cols], built at run time like stock builds it."""
    allowed = emit(aten.tril.default, emit(aten.ones.default, [rows, cols], dtype=torch.bool))
    zeros = emit(aten.zeros.default, [rows, cols], dtype=dtype)
    return emit(aten.masked_fill.Scalar, zeros, emit(aten.logical_not.default, allowed),
                float("-inf"))


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


def merge_mask_repeats(graph: torch.fx.Graph, created: set, more_ops: frozenset = frozenset()
                       ) -> int:
    """Merge the repeated mask computations among ``created`` (nodes a step emitted), of
    :data:`MASK_OPS` and ``more_ops`` (pure ops too); return how many nodes went."""
    return values.merge_repeats(graph, created, MASK_OPS | more_ops)
