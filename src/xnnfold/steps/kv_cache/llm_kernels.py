"""The cache update, and optionally the attention over it, on executorch's LLM kernels (opt-in:
``XnnpackPartitioner(llm_kernels=True)``). A .pte using them runs on runtimes built with
executorch's LLM custom ops (the wheel's pybindings, apps linking its ``custom_ops``), not on
XNNPACK + portable alone.

``llama::update_cache(rows [B', L, H', D], cache [B', S, H', D], P)`` writes ``rows`` into
``cache[:, P:P+L]`` in place: no copy of the cache and no write-back, where the portable
``index_put`` copies the whole cache and the runtime copies it back. It indexes the sequence
at dim 1; transformers' and executorch's plain caches are ``[B, Hkv, S, D]`` with the sequence
at dim 2. The same memory read as ``[B * Hkv, S, 1, D]`` has it at dim 1: the buffer (the
program's own state, read and written by nothing else, :mod:`.pattern` checks that) is given
that shape, its bytes untouched, and the step's rows ``[B, Hkv, L, D]`` are passed as
``[B * Hkv, L, 1, D]``.

The attention then reads the buffer as ``[B * Hkv, S, D]``, in place, either with XNNPACK (the
grouped rewrite of :mod:`.grouped`, all ``S`` rows under the mask) or with
``llama::custom_sdpa(q [B * Hkv, L, G, D], cache, cache, P, is_causal=True)`` — each KV head a
batch entry with its ``G`` query heads — which reads only rows ``0 .. P + l``.

Exact when the update writes rows ``P .. P + L - 1`` (:mod:`.positions`) and the mask is causal
from ``P`` for every ``P`` the update accepts (:mod:`.mask_proof`); the rows ``custom_sdpa``
skips are the masked ones, whose softmax weight is exactly 0 in eager. Which attentions take
these kernels is decided in :mod:`.decide`.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.fx

from ...graph.emit import Emitter
from ...graph.node_meta import tensor_val
from . import layout
from .pattern import CacheAttention, CacheUpdate
from .plan import CAUSAL, Declined, Proof

aten = torch.ops.aten
UPDATE = "llama::update_cache"
SDPA = "llama::custom_sdpa"


def load_kernels() -> None:
    """Register the export-side definitions of executorch's LLM ops."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


def update_in_place(emit: Emitter, attention: CacheAttention, position: torch.fx.Node
                    ) -> None:
    """Beside the attention's two cache updates, ``update_cache`` on the re-laid-out buffers at
    ``position`` (the start's ``item()``, made before any update reads it)."""
    for update in (attention.key, attention.value):
        at_update = layout.beside(emit, update.node)
        rows = layout.rows_flat(at_update, update, extra_dim=True)   # [B * Hkv, L, 1, D]
        at_update(torch.ops.llama.update_cache.default, rows, update.buffer, position)


def cache_3d(emit: Emitter, update: CacheUpdate) -> torch.fx.Node:
    """The re-shaped buffer as ``[B * Hkv, S, D]`` (after its update)."""
    return emit(aten.reshape.default, update.buffer, list(layout.flat_shape(update)))


def custom_sdpa(emit: Emitter, attention: CacheAttention, position: torch.fx.Node) -> None:
    """Replace the SDPA by ``custom_sdpa`` over the re-laid-out buffers."""
    batch, heads, rows, dim = tensor_val(attention.query).shape
    groups = attention.groups
    bh = batch * heads // groups
    q = emit(aten.reshape.default, attention.query, [bh, groups, -1, dim])   # [B*Hkv, G, L, D]
    q = emit(aten.transpose.int, q, 1, 2)                                     # [B*Hkv, L, G, D]
    out = emit(torch.ops.llama.custom_sdpa.default, q, attention.key.buffer,
               attention.value.buffer, position, None, 0.0, True, attention.scale)
    out = emit(aten.transpose.int, out, 1, 2)                                 # [B*Hkv, G, L, D]
    out = emit(aten.reshape.default, out, [batch, heads, -1, dim])
    attention.sdpa.replace_all_uses_with(out)
    emit.graph.erase_node(attention.sdpa)


def why_not_custom_sdpa(attention: CacheAttention, proof: Union[Proof, Declined]
                        ) -> Optional[str]:
    """Why ``llama::custom_sdpa`` (softmax of ``q K^T * scale`` under the causal mask from the
    position, rows 0 .. P + l only) does not compute this attention (its mask proven ``proof``,
    or not, and why), or None."""
    if attention.scores is not None:
        return ("an eager attention: custom_sdpa computes none of its own ops on the scores "
                "(soft-capping, a bias)")
    if attention.value_dim != attention.key.shape[3]:
        return (f"a value head size {attention.value_dim} beside the key's "
                f"{attention.key.shape[3]}: custom_sdpa takes caches of one size")
    if proof == CAUSAL:
        return None
    if isinstance(proof, Proof):
        return f"the mask is {proof.text}: custom_sdpa attends every row up to the position"
    return proof.reason
