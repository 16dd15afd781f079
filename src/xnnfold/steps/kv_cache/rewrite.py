"""The KV-cache step's rewrites: each carries out a :class:`.plan.Plan` (:func:`carry_out`), on
the pass's own copy of the program, and decides nothing. A rewrite that fails half-way is undone
(the buffers put back as exported, what it emitted erased) and the attention stays as stock has
it, saying why."""

from __future__ import annotations

import logging

import torch
import torch.fx

from ...errors import warn_or_raise
from ...graph.emit import Emitter, item
from . import grouped, layout, llm_kernels, visible
from .decide import Facts
from .plan import Path, Plan
from .record import KVCacheRewrite, rewritten

logger = logging.getLogger("xnnfold")
aten = torch.ops.aten


class Built:
    """The nodes the rewrites of one program make once and share: each start position's
    ``item()`` and the count of rows visible from it (:mod:`.visible`)."""

    def __init__(self):
        self.started: dict = {}
        self.visible: dict = {}

    def forget(self, erased: list) -> None:
        """Drop what was built from nodes about to be erased (a rewrite given up)."""
        erased = set(erased)
        self.started = {k: n for k, n in self.started.items() if n not in erased}
        self.visible = {k: n for k, n in self.visible.items() if n not in erased}

    def start_item(self, emit: Emitter, start: torch.fx.Node, cache: int) -> torch.fx.Node:
        """``start.item()`` right after ``start``, constrained to ``0 .. cache - 1`` (the rows
        an update may start at: the range the ShapeEnv reasons with; executorch removes the
        check from the .pte), made once per start, before any update reads it."""
        if start not in self.started:
            at_start = layout.beside(emit, start.next)
            node = item(at_start, start)
            at_start(aten.sym_constrain_range_for_size.default, node, min=0, max=cache - 1)
            self.started[start] = node
        return self.started[start]

    def rows_visible(self, emit: Emitter, plan: Plan) -> torch.fx.Node:
        """The rows visible to the step (:func:`.visible.count`), made once per start."""
        if plan.start not in self.visible:
            cache = plan.attention.key.shape[2]
            self.visible[plan.start] = visible.count(
                emit, self.start_item(emit, plan.start, cache), plan.attention.query, cache)
        return self.visible[plan.start]


def carry_out(plan: Plan, facts: Facts, built: Built) -> KVCacheRewrite:
    """Rewrite ``plan.attention`` as ``plan`` says; its record."""
    attention, program = plan.attention, facts.program
    emit, relaid = Emitter(program.graph, attention.sdpa), []
    try:
        if plan.relaid:
            for update in (attention.key, attention.value):
                shape = layout.relaid_shape(update, plan.llm_kernels)
                layout.reshape_buffer(program, update, shape, emit.fake_mode)
                relaid.append(update)
        how = _PATHS[plan.path](emit, plan, built)
        if plan.relaid:
            _erase_old(emit.graph, attention)
    except Exception as error:  # noqa: BLE001 - this attention stays as stock has it
        for update in relaid:          # the buffers back as they were, then the rewrite undone
            layout.restore_buffer(program, update, emit.fake_mode)
        built.forget(emit.created)
        emit.discard()
        reason = f"internal failure, left as stock leaves it: {type(error).__name__}: {error}"
        warn_or_raise(logger, "xnnfold: kv_cache attention %r %s", attention.sdpa.name, reason)
        return KVCacheRewrite(attention.sdpa.name, _caches(plan), kept_because=reason)
    facts.relaid.update(u.buffer for u in relaid)
    return rewritten(plan, how)


def _caches(plan: Plan) -> tuple:
    return plan.attention.key.target, plan.attention.value.target


def _grouped(emit: Emitter, plan: Plan, built: Built, caches=None) -> str:
    """The grouped attention (:mod:`.grouped`) over the caches ``caches()`` makes (``[B * Hkv,
    S, D]``; default: the updated caches, reshaped), only their visible rows if the plan says
    so."""
    rows = built.rows_visible(emit, plan) if plan.visible_rows else None
    key, value = caches() if caches is not None else (None, None)
    how = grouped.rewrite(emit, plan, key, value, visible=rows)
    if rows is not None:
        visible.mark_sized(emit.created)
    return how


def _shared(emit: Emitter, plan: Plan, built: Built) -> str:
    return _grouped(emit, plan, built)


def _flat(emit: Emitter, plan: Plan, built: Built) -> str:
    """The same updates on the re-shaped buffers, on dim 1, and the attention reading the
    updated buffers as they are."""
    flat = [layout.update_flat(emit, update)
            for update in (plan.attention.key, plan.attention.value)]
    return _grouped(emit, plan, built, lambda: flat)


def _llm_update(emit: Emitter, plan: Plan, built: Built) -> str:
    """The caches updated in place by ``update_cache``, the grouped attention over them."""
    attention = plan.attention
    position = built.start_item(emit, plan.start, attention.key.shape[2])
    llm_kernels.update_in_place(emit, attention, position)
    return _grouped(emit, plan, built, lambda: (llm_kernels.cache_3d(emit, attention.key),
                                                llm_kernels.cache_3d(emit, attention.value)))


def _llm_sdpa(emit: Emitter, plan: Plan, built: Built) -> str:
    """The caches updated in place by ``update_cache``, the attention by ``custom_sdpa``."""
    attention = plan.attention
    position = built.start_item(emit, plan.start, attention.key.shape[2])
    llm_kernels.update_in_place(emit, attention, position)
    llm_kernels.custom_sdpa(emit, attention, position)
    return "custom_sdpa attends rows 0 .. P + l only"


_PATHS = {Path.SHARED: _shared, Path.FLAT: _flat, Path.LLM_UPDATE: _llm_update,
          Path.LLM_SDPA: _llm_sdpa}


def _erase_old(graph: torch.fx.Graph, attention) -> None:
    """The repeats of the caches and the old updates, which nothing reads any more."""
    for node in attention.repeats:
        graph.erase_node(node)
    for update in (attention.key, attention.value):
        graph.erase_node(update.node)
