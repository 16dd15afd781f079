"""The KV-cache step's decision for one attention, before anything is rewritten: what it matches
(:mod:`.pattern`, :mod:`.eager`), what the program proves of it (the positions written,
:mod:`.positions`; the mask, :mod:`.mask_proof`) and where its caches are read; from that, a
:class:`.plan.Plan` or :class:`.plan.Declined` (:func:`decide`).

The paths, most taken first:

- the LLM kernels (asked for) where the caches are this attention's alone, its positions are
  ``arange(L) + P`` and an ``item()`` of ``P`` is safe: ``llama::update_cache``, then
  ``llama::custom_sdpa`` where that kernel computes this attention (:mod:`.llm_kernels`), else
  the grouped attention over the updated caches;
- the grouped attention over the caches re-shaped ``[B * Hkv, S, D]`` where they are its alone;
- the grouped attention over the caches as they are (they keep their shape).

The default paths read only the visible rows (:mod:`.visible`) where the step's partitioner takes
them and the mask is proven to block every row past the position.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.fx
from torch.export import ExportedProgram

from ...analysis import static_inputs
from ...graph.sdpa import SDPA
from ...graph.values import ValueNumbers, written_placeholders
from . import eager, llm_kernels, mask_proof, pattern, positions, visible
from .plan import Declined, Path, Plan, Proof


def why_no_item(program: ExportedProgram) -> Optional[str]:
    """Why the step makes no ``item()`` of the start position in ``program`` (the LLM kernels'
    and the visible rows' need), or None. A program with control flow (a mixture of experts'
    ``torch.cond``) fails its next retrace with one beside it (measured: executorch's
    ``run_decompositions`` raises ``PendingUnbackedSymbolNotFound`` from the first branch)."""
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            return (f"the program has control flow ({node.target.__name__}): an item() of the "
                    "position beside it fails its retrace")
    return None


class Facts:
    """What the decisions on one program read: its cache updates, static inputs, written
    buffers and value numbers, the mask proofs made so far, and the caches already re-shaped
    (by an earlier attention's rewrite: a later one reading them keeps them as they are)."""

    def __init__(self, program: ExportedProgram, updates: dict, llm_kernels: bool = False,
                 visible_rows: bool = False):
        self.program, self.llm_kernels, self.visible_rows = program, llm_kernels, visible_rows
        self.updates = updates       # {update node: CacheUpdate} (:func:`.pattern.find_updates`)
        names = static_inputs(program)
        self.static = {n: names[n.name] for n in program.graph.nodes
                       if n.op == "placeholder" and n.name in names}
        self.written = set(written_placeholders(program))
        self.numbers = ValueNumbers(program.graph, self.written)
        self.no_item = why_no_item(program)
        self.relaid: set = set()
        self._proofs: dict = {}

    def proof(self, attention: pattern.CacheAttention, start) -> Union[Proof, Declined]:
        """What this attention's mask is proven to be from its start position, or why not
        (:func:`.mask_proof.prove_mask`, once per mask, start and length)."""
        if attention.mask is None:
            return Declined("no mask: every cache row is attended")
        if start is None:
            return Declined("the positions are not arange(L) + P or a single position")
        rows = attention.query.meta["val"].shape[2]      # an int, or a dynamic length
        key = (attention.mask, start, str(rows))
        if key not in self._proofs:
            self._proofs[key] = mask_proof.prove_mask(
                attention.mask, start, rows, attention.key.shape[2], self.static, self.written,
                self.numbers)
        return self._proofs[key]


def decide(node: torch.fx.Node, facts: Facts) -> Union[Plan, Declined, None]:
    """The plan for ``node`` (an SDPA or a softmax) if it is an attention over caches the step
    takes; Declined if it reads a cache in a way the step does not take; None if it is not an
    attention over a cache (not the step's business)."""
    if node.target is SDPA:
        match = pattern.match_attention(node, facts.updates)
    else:
        match = eager.match_eager(node, facts.updates)
    if match is None or isinstance(match, Declined):
        return match
    return _plan(match, facts)


def _plan(attention: pattern.CacheAttention, facts: Facts) -> Plan:
    key, value = attention.key, attention.value
    start = positions.start_of(key.positions, facts.numbers)
    if start is not None and not positions.same_positions(key.positions, value.positions,
                                                          facts.numbers):
        start = None
    proof = facts.proof(attention, start)
    proven = proof if isinstance(proof, Proof) else None
    # the caches re-shaped (every path but SHARED) only where this attention alone reads them
    private = _why_not_private(facts, attention)
    # why the LLM kernels' in-place update cannot write these caches
    why_not_update = private or (None if start is not None else
                                 "the positions written are not arange(L) + P (or a single "
                                 "position) for both caches") or facts.no_item
    if facts.llm_kernels and why_not_update is None:
        why_not_sdpa = llm_kernels.why_not_custom_sdpa(attention, proof)
        if why_not_sdpa is None:
            return Plan(attention, Path.LLM_SDPA, proven, start, visible_rows=False)
        return Plan(attention, Path.LLM_UPDATE, proven, start,
                    _reads_visible_rows(facts, attention, proven, start),
                    llm_declined=f"custom_sdpa: {why_not_sdpa}")
    path = Path.FLAT if private is None else Path.SHARED
    return Plan(attention, path, proven, start,
                path is Path.FLAT and _reads_visible_rows(facts, attention, proven, start),
                llm_declined=why_not_update if facts.llm_kernels else None)


def _why_not_private(facts: Facts, attention: pattern.CacheAttention) -> Optional[str]:
    """Why the caches are not this attention's alone (then they keep their shape), or None."""
    for update in (attention.key, attention.value):
        if update.is_input:
            return f"the cache {update.target} is a program input: its shape is the caller's"
    chain = set(attention.repeats) | set(attention.between) | {attention.sdpa}
    for node in [attention.key.node, attention.value.node] + attention.repeats:
        others = [u for u in node.users if u not in chain]
        if others:
            return f"the updated cache ({node.name}) is also read by {others[0].name}"
    for update in (attention.key, attention.value):
        if update.buffer in facts.relaid:
            return f"the cache {update.target} is read by another attention"
    return None


def _reads_visible_rows(facts: Facts, attention: pattern.CacheAttention,
                        proven: Optional[Proof], start) -> bool:
    """Whether the grouped attention reads only the visible rows (:mod:`.visible`)."""
    if not facts.visible_rows or attention.mask is None or attention.scores is not None or \
            facts.no_item is not None:
        return False
    # (fp32 only, as visible_config takes it: the step rewrites fp32 caches alone, pairing.py)
    return visible.why_not(proven, start) is None
