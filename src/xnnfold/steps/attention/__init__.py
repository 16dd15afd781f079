"""Attention glue off portable: each ``scaled_dot_product_attention`` (:mod:`.sdpa`) and each
batched ``matmul`` of activations (:mod:`.matmul`, the eager way to write attention) rewritten
into ops XNNPACK takes, where that is exact and XNNPACK takes all of them; the others are left as
they were, and say why. ``explain`` lists each as an :class:`AttentionRewrite`."""

from __future__ import annotations

import logging

from torch.export import ExportedProgram

from ...errors import warn_or_raise
from ..protocol import Context, Outcome
from . import matmul, sdpa
from ...graph.emit import Emitter
from .record import AttentionRewrite
from ...graph import sdpa as sdpa_rules
from ...graph.sdpa import SDPA
from .sdpa import CAUSAL, KEEP_FACTOR, NO_MASK

logger = logging.getLogger("xnnfold")

__all__ = ["AttentionRewrite", "CAUSAL", "KEEP_FACTOR", "NO_MASK", "SDPA", "rewrite_attention"]


def rewrite_attention(program: ExportedProgram) -> list:
    """Rewrite, in place, every SDPA and batched ``matmul`` node of ``program`` (the pass's own
    copy) that XNNPACK takes whole once rewritten; return an :class:`AttentionRewrite` for each
    such node, rewritten or kept."""
    graph, records = program.graph, []
    before = set(graph.nodes)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is SDPA:
            step, op = sdpa, "attention"
        elif matmul.is_batched(node):
            step, op = matmul, "matmul"
        else:
            continue
        name, emit = node.name, None
        try:   # the check too: a failure anywhere keeps this node as stock has it, only it
            reason = step.why_kept(node)
            if reason is None:
                emit = Emitter(graph, node)
                records.append(AttentionRewrite(name, proven=step.rewrite_one(emit, node), op=op))
                continue
        except Exception as error:  # noqa: BLE001 - this node stays as stock has it
            if emit is not None:
                emit.discard()
            reason = (f"internal failure, left as stock leaves it: "
                      f"{type(error).__name__}: {error}")
            warn_or_raise(logger, "xnnfold: %s %r %s", op, name, reason)
        records.append(AttentionRewrite(name, kept_because=reason, op=op))
    if any(r.rewritten for r in records):
        # one mask, computed once
        sdpa_rules.merge_mask_repeats(graph, set(graph.nodes) - before)
    return records


class AttentionStep:
    name = "attention"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_attention(program))


STEP = AttentionStep()
