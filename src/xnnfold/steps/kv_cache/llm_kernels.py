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

Exact when the update writes rows ``P .. P + L - 1`` and the mask is causal from ``P`` for
every ``P`` the update accepts (:mod:`.positions`); the rows ``custom_sdpa`` skips are the
masked ones, whose softmax weight is exactly 0 in eager.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ...graph.emit import Emitter, item
from ...graph.node_meta import tensor_val
from . import layout
from .pattern import CacheAttention, CacheUpdate
from .positions import CAUSAL

aten = torch.ops.aten
UPDATE = "llama::update_cache"
SDPA = "llama::custom_sdpa"


def load_kernels() -> None:
    """Register the export-side definitions of executorch's LLM ops."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


def _beside(emit: Emitter, anchor: torch.fx.Node) -> Emitter:
    """An emitter before ``anchor`` in ``emit``'s fake mode (an anchor without inputs, an
    ``arange``, has none of its own)."""
    other = Emitter(emit.graph, anchor)
    other.fake_mode = emit.fake_mode
    return other


def start_item(emit: Emitter, start: torch.fx.Node, cache: int) -> torch.fx.Node:
    """``start.item()`` right after ``start``, constrained to ``0 .. cache - 1`` (the rows an
    update may start at: the range the ShapeEnv reasons with; executorch removes the check from
    the .pte); what it creates is recorded in ``emit``."""
    at_start = _beside(emit, start.next)
    node = item(at_start, start)
    at_start(aten.sym_constrain_range_for_size.default, node, min=0, max=cache - 1)
    emit.created += at_start.created
    return node


def update_in_place(emit: Emitter, attention: CacheAttention, start: torch.fx.Node,
                    started: dict) -> None:
    """Replace the attention's two cache updates by ``update_cache`` on the re-laid-out
    buffers. ``started``: {start node: its item() node}, shared by the layers, made right
    after the start node, before any update reads it."""
    if start not in started:
        started[start] = start_item(emit, start, attention.key.shape[2])
    for update in (attention.key, attention.value):
        at_update = _beside(emit, update.node)
        rows = layout.rows_flat(at_update, update, extra_dim=True)   # [B * Hkv, L, 1, D]
        at_update(torch.ops.llama.update_cache.default, rows, update.buffer, started[start])
        emit.created += at_update.created


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


def erase_old(graph: torch.fx.Graph, attention: CacheAttention) -> None:
    """The repeats of the caches and the old updates, which nothing reads any more."""
    for node in attention.repeats:
        graph.erase_node(node)
    for update in (attention.key, attention.value):
        graph.erase_node(update.node)


def why_not_custom_sdpa(attention: CacheAttention, proven, why_not) -> Optional[str]:
    """Why ``llama::custom_sdpa`` (softmax of ``q K^T * scale`` under the causal mask from the
    position, rows 0 .. P + l only) does not compute this attention, or None."""
    if attention.scores is not None:
        return ("an eager attention: custom_sdpa computes none of its own ops on the scores "
                "(soft-capping, a bias)")
    if attention.value_dim != attention.key.shape[3]:
        return (f"a value head size {attention.value_dim} beside the key's "
                f"{attention.key.shape[3]}: custom_sdpa takes caches of one size")
    if proven == CAUSAL:
        return None
    if proven:
        return f"the mask is {proven}: custom_sdpa attends every row up to the position"
    return why_not
