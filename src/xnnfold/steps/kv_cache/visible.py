"""The cache rows a step can see: rows ``0 .. P + L - 1``, a count known at run time.

A decoder step writes rows ``P .. P + L - 1`` of a static cache of ``S`` rows and, under a
causal mask (or a causal one within a sliding window), attends only to rows up to ``P + L - 1``:
every later row is ``-inf`` in its additive mask, a softmax weight of exactly 0. Attending over
all ``S`` rows costs ``S`` rows per layer and step, which XNNPACK pays in full: it packs the
right operand of each of the attention's two ``bmm`` on every run. Measured on a small Llama
(8da4w, 1,024 cache rows, position 160, one thread): the attention's delegate took 0.100 ms per
layer of a 1.13 ms step over every row, 0.017 ms over the visible rows, plus 0.005 ms for each
of the two slices below.

This module builds, once per program, the count ``V = P + L`` (``P.item()``, the step's start,
an unbacked SymInt constrained to ``0 .. S - 1``, plus the step's length; ``V <= S`` asserted
for the ShapeEnv, which then sizes the slices ``V``; executorch strips both checks from the
.pte, where the cache update's own bounds check refuses a start past the cache), the cache cut
to its first ``V`` rows
(``slice`` on portable: XNNPACK's slice takes static sizes only; XNNPACK's ``bmm`` then reads a
shape it is given at each call, see :mod:`.visible_config`), and the additive mask over those
rows, built from the positions on ``[L, V]`` rather than the model's ``[L, S]``.

Only where the step's positions are proven ``arange(L) + P`` and its mask proven, for every
``P`` the cache accepts and every length the step may have (:mod:`.mask_proof`), causal from
``P`` or causal within a window: the rows dropped are then blocked for every query row, and the
mask built is the model's on the rows kept. The attention is eager's.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx

from ...graph.emit import Emitter
from ...graph.node_meta import tensor_val
from . import visible_config
from .plan import Proof

aten = torch.ops.aten
HOW = "only the rows up to the position read (P + L rows, a count known at run time)"


def why_not(proof: Optional[Proof], start) -> Optional[str]:
    """Why this attention reads every cache row (None: it may read the visible rows only), its
    mask proven ``proof`` (or not, None). A mask per head is proven head by head against the
    one table (:mod:`.mask_proof`), a mask per batch is not proven: the mask built here serves
    every head and batch entry."""
    if start is None:
        return "the positions written are not proven arange(L) + P"
    if proof is None or not proof.blocks_past_position:
        return "the mask is not proven causal from the position"
    return None


def count(emit: Emitter, start_item: torch.fx.Node, query: torch.fx.Node, cache: int
          ) -> torch.fx.Node:
    """``P + L``: the rows visible to a step of ``L`` rows (``query``'s dim 2) from position
    ``P`` (``start_item``: ``P.item()``, an unbacked SymInt), made before the first attention
    that reads it (``emit``'s anchor)."""
    length = tensor_val(query).shape[2]
    if not isinstance(length, int):
        length = emit(aten.sym_size.int, query, 2)
    end = emit(operator.add, start_item, length)
    # P + L <= S for every step the update accepts, but not from the symbols' ranges alone
    # (P <= S - 1, L <= its bound): asserted, a fact the ShapeEnv then knows, the slices' sizes
    # are P + L, not fresh unbound symbols (executorch removes the assert from the .pte, and
    # plans the slices for the ranges' bound, S - 1 + L's largest)
    emit(aten._assert_scalar.default, emit(operator.le, end, cache),
         f"xnnfold: the step's last row is past the cache's {cache} rows")
    return end


def mark_sized(nodes) -> None:
    """Mark, for :mod:`.visible_config`, the nodes whose sizes include the visible rows."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in nodes:
        if any(free_unbacked_symbols(t) for t in visible_config.tensors_of(node)):
            visible_config.mark(node)


def rows(emit: Emitter, cache3: torch.fx.Node, visible: torch.fx.Node) -> torch.fx.Node:
    """``cache3 [B * Hkv, S, D]`` cut to its first ``visible`` rows."""
    return emit(aten.slice.Tensor, cache3, 1, 0, visible)


def window_rows(proof: Optional[Proof]) -> Optional[int]:
    """``W`` where a query row attends the ``W`` rows up to its position only (a window), None
    where it attends every row up to it: the lower bound of the mask built below."""
    return proof.window if proof is not None else None


def mask(emit: Emitter, positions: torch.fx.Node, visible: torch.fx.Node, groups: int,
         proof: Optional[Proof], dtype: torch.dtype) -> torch.fx.Node:
    """The additive mask over the visible rows, ``[G * L, V]`` (row ``g * L + l`` of the
    grouped scores: query row ``l`` at position ``positions[l]``): 0 where the proven mask
    attends (column ``c <= positions[l]``, and ``c > positions[l] - W`` within a window of
    ``W``), ``-inf`` elsewhere. Built on portable, on ``[L, V]``, once per program (every
    layer's positions are the same values, ``arange(L) + P``: the step merges the repeats):
    the model's own mask is proven to be this one, over all ``S`` columns
    (:mod:`.mask_proof`), and is no longer computed."""
    columns = emit(aten.arange.default, visible, dtype=tensor_val(positions).dtype)
    at = emit(aten.unsqueeze.default, positions, 1)                         # [L, 1]
    attended = emit(aten.le.Tensor, columns, at)                             # [L, V]
    window = window_rows(proof)
    if window is not None:
        attended = emit(aten.logical_and.default, attended,
                        emit(aten.gt.Tensor, columns, emit(aten.sub.Tensor, at, window)))
    additive = emit(aten.where.self, attended,
                    emit(aten.scalar_tensor.default, 0.0, dtype=dtype),
                    emit(aten.scalar_tensor.default, float("-inf"), dtype=dtype))
    if groups > 1:
        additive = emit(aten.repeat.default, additive, [groups, 1])
    return additive
