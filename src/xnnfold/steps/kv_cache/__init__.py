"""The KV-cache step: a decoder LM's attention over its static KV cache off portable.

transformers' ExecuTorch export (``TorchExportableModuleForDecoderOnlyLM``, static cache) and
executorch's example Llama with its plain KV cache write each step's keys and values into a
buffer ``[B, Hkv, S, D]`` in place and attend over the whole buffer under a mask built from the
cache position, repeating it for grouped-query attention. Lowered as it is, the repeat is an
``expand_copy`` (and an ``unsqueeze_copy``) of the whole cache on portable per layer and step,
and SDPA's safe-softmax glue sits between three delegates.

Each such attention (:mod:`.pattern`) is rewritten, on the pass's own copy of the program:

- by default (:mod:`.grouped`) into ops XNNPACK takes, the query heads of a KV head folded into
  the rows of one product with the cache, nothing repeated; runs on any runtime with XNNPACK
  and the portable kernels;
- with ``llm_kernels=True`` (:mod:`.llm_kernels`), where the positions and the mask are proven
  (:mod:`.positions`, :mod:`.mask_proof`), onto executorch's ``llama::update_cache`` (in place)
  and ``llama::custom_sdpa`` (only the rows up to the position), the kernels of its own LLM flow.

An attention is an SDPA (:mod:`.pattern`) or written out op by op (:mod:`.eager`: Gemma2's
soft-capping, ALiBi biases); the latter keeps its own ops on the scores (:mod:`.scores`).

An attention the step does not take is left as it was and says why; one it does not recognise
as reading a cache is not its business (the attention step, next, rewrites it as any other).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx

from torch.export import ExportedProgram

from ...analysis import static_inputs
from ...errors import warn_or_raise
from ...graph.emit import Emitter
from ...graph.node_meta import tensor_val
from ...graph.sdpa import SDPA
from ...graph.values import ValueNumbers, written_placeholders
from ..protocol import Context, Outcome
from . import eager, grouped, layout, llm_kernels, mask_proof, pattern, positions, visible
from .record import (KVCacheRewrite, UPDATE_LEFT, VISIBLE_LEFT, attention_left,
                     grouped_kernels)

logger = logging.getLogger("xnnfold")

def _why_no_item(program: ExportedProgram) -> Optional[str]:
    """Why the step makes no ``item()`` of the start position in ``program`` (the LLM kernels'
    and the visible rows' need), or None. A program with control flow (a mixture of experts'
    ``torch.cond``) fails its next retrace with one beside it (measured: executorch's
    ``run_decompositions`` raises ``PendingUnbackedSymbolNotFound`` from the first branch)."""
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            return (f"the program has control flow ({node.target.__name__}): an item() of the "
                    "position beside it fails its retrace")
    return None


class _Context:
    """What the rewrites of one program share: facts, proofs, the mask parts, the item()."""

    def __init__(self, program: ExportedProgram, visible_rows: bool = False):
        self.program = program
        self.visible_rows = visible_rows
        names = static_inputs(program)
        self.static = {n: names[n.name] for n in program.graph.nodes
                       if n.op == "placeholder" and n.name in names}
        self.written = set(written_placeholders(program))
        self.numbers = ValueNumbers(program.graph, self.written)
        self.proofs: dict = {}
        self.masks = grouped.MaskParts()
        self.started: dict = {}
        self.relaid: set = set()
        self.visible: dict = {}
        self.no_item = _why_no_item(program)

    def forget(self, erased: list) -> None:
        """Drop what was built from nodes about to be erased (a rewrite given up)."""
        erased = set(erased)
        self.started = {k: n for k, n in self.started.items() if n not in erased}
        self.visible = {k: n for k, n in self.visible.items() if n not in erased}
        self.masks.forget(erased)

    def rows_visible(self, emit: Emitter, attention: pattern.CacheAttention, start):
        """The rows visible to the step (:func:`.visible.count`), made once per start."""
        if start not in self.visible:
            cache = attention.key.shape[2]
            if start not in self.started:
                self.started[start] = llm_kernels.start_item(emit, start, cache)
            self.visible[start] = visible.count(emit, self.started[start], attention.query,
                                                cache)
        return self.visible[start]

    def proof(self, attention: pattern.CacheAttention, start) -> tuple:
        """(what the mask is proven to be, or False; why not) for this attention's mask and
        start position (:func:`.mask_proof.prove_mask`)."""
        if attention.mask is None:
            return False, "no mask: every cache row is attended"
        if start is None:
            return False, "the positions are not arange(L) + P or a single position"
        rows = attention.query.meta["val"].shape[2]      # an int, or a dynamic length
        key = (attention.mask, start, str(rows))
        if key not in self.proofs:
            self.proofs[key] = mask_proof.prove_mask(
                attention.mask, start, rows, attention.key.shape[2], self.static, self.written,
                self.numbers)
        proven, text = self.proofs[key]
        return (text if proven else False), (None if proven else text)


def rewrite_kv_caches(program: ExportedProgram, llm_kernels_wanted: bool = False,
                      visible_rows: bool = False) -> list:
    """Rewrite, in place, every attention of ``program`` (the pass's own copy) over a KV cache
    the step recognises; return a :class:`KVCacheRewrite` for each, rewritten or kept.
    ``visible_rows``: the default rewrite reads only the rows up to the position where that is
    exact (:mod:`.visible`); only for a partitioner that takes them
    (:mod:`.visible_config`)."""
    updates, _ = pattern.find_updates(program)
    if not updates:
        return []
    if llm_kernels_wanted:
        llm_kernels.load_kernels()
    context, records = _Context(program, visible_rows), []
    for node in list(program.graph.nodes):
        if node.op != "call_function" or node.target not in (SDPA,) + eager.SOFTMAXES:
            continue
        # the match and the proofs too: a failure anywhere keeps this attention as stock has
        # it (what _rewrite_one emitted is undone there), and only it
        try:
            match = pattern.match_attention(node, updates) if node.target is SDPA \
                else eager.match_eager(node, updates)
            if match is None:
                continue
            if isinstance(match, str):
                records.append(KVCacheRewrite(node.name, kept_because=match))
                continue
            records.append(_rewrite_one(context, match, llm_kernels_wanted))
        except Exception as error:  # noqa: BLE001 - this attention stays as stock has it
            reason = f"internal failure, left as stock leaves it: {type(error).__name__}: {error}"
            warn_or_raise(logger, "xnnfold: kv_cache attention %r %s", node.name, reason)
            records.append(KVCacheRewrite(node.name, kept_because=reason))
    if any(r.rewritten for r in records):
        program.graph.eliminate_dead_code()
        program.graph.lint()
        program.graph_module.recompile()
    return records


def _rewrite_one(context: _Context, attention: pattern.CacheAttention, llm_wanted: bool
                 ) -> KVCacheRewrite:
    name = attention.sdpa.name
    caches = (attention.key.target, attention.value.target)
    key, value = attention.key, attention.value
    start = positions.start_of(key.positions, context.numbers)
    if start is not None and not positions.same_positions(key.positions, value.positions,
                                                          context.numbers):
        start = None
    proven, why_not = context.proof(attention, start)
    # the caches re-shaped (both paths) only where this attention alone reads them
    private = _why_not_private(context, attention)
    in_place = private or (None if start is not None else
                           "the positions written are not arange(L) + P (or a single "
                           "position) for both caches") or context.no_item
    emit = Emitter(context.program.graph, attention.sdpa)
    try:
        if llm_wanted and in_place is None:
            return _llm(context, emit, attention, start, name, caches, proven,
                        llm_kernels.why_not_custom_sdpa(attention, proven, why_not))
        if private is None:
            how = _flat(context, emit, attention, proven, start)
        else:
            how = grouped.rewrite(emit, attention, context.masks, proven)
    except Exception as error:  # noqa: BLE001 - this attention stays as stock has it
        context.forget(emit.created)
        emit.discard()
        reason = f"internal failure, left as stock leaves it: {type(error).__name__}: {error}"
        warn_or_raise(logger, "xnnfold: kv_cache attention %r %s", name, reason)
        return KVCacheRewrite(name, caches, kept_because=reason)
    read = (VISIBLE_LEFT,) if visible.HOW in how else attention_left(attention)
    return KVCacheRewrite(name, caches, grouped_kernels(attention), how,
                          left=(UPDATE_LEFT,) + read,
                          llm_declined=in_place if llm_wanted else None)


def _why_not_private(context: _Context, attention: pattern.CacheAttention) -> Optional[str]:
    """Why the caches are not this attention's alone (then they keep their shape), or None."""
    chain = set(attention.repeats) | set(attention.between) | {attention.sdpa}
    for node in [attention.key.node, attention.value.node] + attention.repeats:
        others = [u for u in node.users if u not in chain]
        if others:
            return f"the updated cache ({node.name}) is also read by {others[0].name}"
    for update in (attention.key, attention.value):
        if update.buffer in context.relaid:
            return f"the cache {update.target} is read by another attention"
    return None


def _flat(context: _Context, emit: Emitter, attention: pattern.CacheAttention, proven: bool,
          start) -> str:
    """The default rewrite on caches re-shaped ``[B * Hkv, S, D]``: the same updates, on dim 1,
    and the attention reading the updated buffers as they are, only their visible rows where
    the mask is proven to block the rest (:mod:`.visible`)."""
    reshaped, flat = [], []
    try:
        for update in (attention.key, attention.value):
            layout.reshape_buffer(context.program, update, layout.flat_shape(update),
                                  emit.fake_mode)
            reshaped.append(update)
        for update in (attention.key, attention.value):
            flat.append(layout.update_flat(emit, update))
        rows = _visible_rows(context, emit, attention, proven, start)
        how = grouped.rewrite(emit, attention, context.masks, proven, *flat, visible=rows)
        if rows is not None:
            visible.mark_sized(emit.created)
        llm_kernels.erase_old(emit.graph, attention)
    except Exception:
        for update in reshaped:
            layout.restore_buffer(context.program, update, emit.fake_mode)
        raise
    context.relaid.update(u.buffer for u in reshaped)
    return how + "; the cache kept as [B * Hkv, S, D], the same bytes"


def _visible_rows(context: _Context, emit: Emitter, attention: pattern.CacheAttention, proven,
                  start) -> Optional[torch.fx.Node]:
    """The count of rows the attention reads (:mod:`.visible`), or None: every row."""
    if not context.visible_rows or attention.mask is None or attention.scores is not None or \
            context.no_item is not None:
        return None
    # (fp32 only, as visible_config takes it: the step rewrites fp32 caches alone, pattern.py)
    if visible.why_not(proven, start) is not None:
        return None
    return context.rows_visible(emit, attention, start)


def _llm(context: _Context, emit: Emitter, attention: pattern.CacheAttention, start, name,
         caches, proven: bool, sdpa_declined: Optional[str]) -> KVCacheRewrite:
    """The caches updated in place by ``update_cache``; the attention over them by
    ``custom_sdpa`` where the mask is proven causal from the position, else by XNNPACK under
    the mask."""
    relaid = []
    try:
        for update in (attention.key, attention.value):
            b, hkv, s, d = update.shape
            layout.reshape_buffer(context.program, update, (b * hkv, s, 1, d), emit.fake_mode)
            relaid.append(update)
        llm_kernels.update_in_place(emit, attention, start, context.started)
        if sdpa_declined is None:
            llm_kernels.custom_sdpa(emit, attention, context.started[start])
            kernels, how = f"{llm_kernels.UPDATE}, {llm_kernels.SDPA}", \
                "custom_sdpa attends rows 0 .. P + l only"
        else:
            rows = _visible_rows(context, emit, attention, proven, start)
            how = grouped.rewrite(emit, attention, context.masks, proven,
                                  llm_kernels.cache_3d(emit, attention.key),
                                  llm_kernels.cache_3d(emit, attention.value), visible=rows)
            if rows is not None:
                visible.mark_sized(emit.created)
            kernels = f"{llm_kernels.UPDATE}, {grouped_kernels(attention)}"
        llm_kernels.erase_old(emit.graph, attention)
    except Exception:
        for update in relaid:          # the buffer back as it was, then the rewrite undone
            layout.restore_buffer(context.program, update, emit.fake_mode)
        raise
    context.relaid.update(u.buffer for u in relaid)
    left = () if sdpa_declined is None else \
        (VISIBLE_LEFT,) if visible.HOW in how else attention_left(attention)
    return KVCacheRewrite(name, caches, kernels,
                          f"rows P .. P + L - 1 written in place; {how}; the cache kept as "
                          "[B * Hkv, S, 1, D], the same bytes", left=left,
                          llm_declined=None if sdpa_declined is None else
                          f"custom_sdpa: {sdpa_declined}")


class KVCacheStep:
    """``visible_rows``: see :func:`rewrite_kv_caches`."""

    name = "kv_cache"

    def __init__(self, visible_rows: bool = False):
        self.visible_rows = visible_rows

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_kv_caches(program, context.llm_kernels, self.visible_rows))

    def open(self, partitioner):
        """The visible rows where the partitioner's configs can take them (the protocol)."""
        from .visible_config import open_visible_rows
        return open_visible_rows(partitioner, STEP_VISIBLE_ROWS, STEP)

    def summary(self, records: list) -> Optional[str]:
        """Which kernels the lowered program needs, after this step."""
        if not records:
            return None
        custom = sorted({k.strip() for r in records if r.rewritten and r.kernels
                         for k in r.kernels.split(",") if "::" in k})
        if not custom:
            return "kernels the .pte needs: XNNPACK and the portable kernels (any runtime)"
        return (f"kernels the .pte needs: XNNPACK, the portable kernels and executorch's LLM "
                f"custom ops {', '.join(custom)} (a runtime built with them: the wheel's "
                "pybindings, apps linking executorch's custom_ops)")


STEP = KVCacheStep()
# the step of a partitioner whose configs take the attention over the visible rows
# (xnnfold.XnnpackPartitioner, unless executorch's internals are not what it wraps)
STEP_VISIBLE_ROWS = KVCacheStep(visible_rows=True)
