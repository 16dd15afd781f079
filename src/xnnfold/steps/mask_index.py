"""Indexing by ``torch.where(mask)`` rewritten as indexing by ``mask`` itself.

``x[torch.where(mask)] = v`` (transformers' OneFormer: ``attention_mask[torch.where(
attention_mask.sum(-1) == attention_mask.shape[-1])] = False``) and ``x[torch.where(mask)]``
export as ``where(mask)`` (or ``nonzero_numpy``, from ``mask.nonzero(as_tuple=True)``), one
index tensor per dim of ``mask``, read by ``index_put_`` / ``index``. Edge decomposes ``where``
into ``nonzero`` and a ``slice_copy`` + ``squeeze_copy`` per column, and executorch 1.5.1 cannot
run that: torch's fake ``nonzero`` has strides ``(1, n)`` (eager's column-major layout), so the
emitter declares its output in dim order ``(1, 0)``; the portable ``nonzero`` kernel writes its
rows contiguously whatever the declared order, and the portable ``slice_copy`` that reads it
checks that its input and output have one dim order (``tensors_have_same_dim_order``): the .pte
fails at run time, ``Failed to execute method forward, error: 0x12``, stock's and xnnfold's
alike, with or without a partitioner.

A bool mask whose shape is ``x``'s leading dims indexes exactly the elements its ``where`` does,
in the same (row-major) order: that is how torch itself defines boolean-mask indexing. So the
index list is replaced by ``[mask]``: the same values, no ``nonzero`` in the program, and no
data-dependent size for an ``index_put_``. The ``where`` goes too when nothing else reads it
but the shape assertions export attached to it (each holds by construction: ``0 <= n <=
mask.numel()``). Only bool masks, ``accumulate=False``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from ..errors import at_node
from ..graph.node_meta import tensor_val
from .protocol import Context, Outcome

aten = torch.ops.aten
_WHERE = (aten.where.default, aten.nonzero_numpy.default)
_INDEXING = (aten.index_put_.default, aten.index_put.default, aten.index.Tensor)


@dataclass(frozen=True)
class MaskIndexRewrite:
    """One ``index_put_`` / ``index_put`` / ``index`` node now indexed by the bool mask."""

    node: str
    mask: str
    where: str
    where_removed: bool       # False: something else still reads the where's indices
    rewritten = True

    def describe(self) -> str:
        gone = "its where (nonzero) removed" if self.where_removed else \
            f"{self.where} kept: something else reads its indices"
        return (f"mask_index step: {self.node} indexed by the bool mask {self.mask} instead of "
                f"{self.where}({self.mask}); {gone}")


def _where_of(indices) -> Optional[torch.fx.Node]:
    """The ``where(mask)`` node whose outputs ``indices`` are, all of them and in order."""
    if not isinstance(indices, (list, tuple)) or not indices:
        return None
    if not all(isinstance(i, torch.fx.Node) and i.op == "call_function" and
               i.target is operator.getitem for i in indices):
        return None
    where = indices[0].args[0]
    if not isinstance(where, torch.fx.Node) or where.op != "call_function" or \
            where.target not in _WHERE:
        return None
    if [(i.args[0], i.args[1]) for i in indices] != [(where, k) for k in range(len(indices))]:
        return None
    return where


def _rewritable(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The ``where`` node of an index op this step rewrites, or None."""
    if node.op != "call_function" or node.target not in _INDEXING or len(node.args) < 2:
        return None
    if node.target is not aten.index.Tensor:
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate is not False:
            return None
    where = _where_of(node.args[1])
    if where is None:
        return None
    x, mask = tensor_val(node.args[0]), tensor_val(where.args[0])
    k = len(node.args[1])
    if x is None or mask is None or mask.dtype != torch.bool or mask.dim() != k or \
            x.dim() < k:
        return None
    if not all(statically_known_true(a == b) for a, b in zip(x.shape[:k], mask.shape)):
        return None
    return where


def _dead_chain(where: torch.fx.Node) -> Optional[list]:
    """``where``, its outputs and the shape assertions on them, if nothing else reads them."""
    chain, todo = {where}, list(where.users)
    while todo:
        node = todo.pop()
        if node in chain:
            continue
        if node.op != "call_function":
            return None
        is_output = node.target is operator.getitem and node.args[0] is where
        if not is_output and tensor_val(node) is not None:
            return None         # a tensor computed from the indices: they are still needed
        chain.add(node)
        todo += list(node.users)
    return [n for n in where.graph.nodes if n in chain]


def _drop_ranges(program: ExportedProgram, symbols: set) -> None:
    """Drop the ranges of the removed wheres' sizes that no node has any more (``torch.export.
    load`` warns of each range whose symbol is not in the graph)."""
    left = set()
    for node in program.graph.nodes:
        left |= free_unbacked_symbols(node.meta.get("val"))
    for symbol in symbols - left:
        program.range_constraints.pop(symbol, None)    # the copy's own dict


def rewrite_mask_indexing(program: ExportedProgram) -> list:
    """Rewrite, in place, each index op of ``program`` (the pass's own copy) indexed by all the
    outputs of one ``where(mask)``; return a :class:`MaskIndexRewrite` for each."""
    graph, rewritten = program.graph, []
    for node in list(graph.nodes):
        where = _rewritable(node)
        if where is not None:
            with at_node(node, "indexing by the mask"):
                node.args = (node.args[0], [where.args[0]], *node.args[2:])
            rewritten.append((node.name, where.args[0].name, where))
    removed, symbols = set(), set()
    for where in dict.fromkeys(w for _, _, w in rewritten):   # once each, in graph order
        chain = _dead_chain(where)
        if chain is not None:
            with at_node(where, "removing the where no index reads"):
                symbols |= free_unbacked_symbols(where.meta.get("val"))
                for dead in reversed(chain):
                    graph.erase_node(dead)
            removed.add(where)
    if rewritten:
        _drop_ranges(program, symbols)
    return [MaskIndexRewrite(node, mask, where.name, where in removed)
            for node, mask, where in rewritten]


class MaskIndexStep:
    name = "mask_index"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_mask_indexing(program))


STEP = MaskIndexStep()
