"""Attention glue off portable: each ``scaled_dot_product_attention`` (:mod:`.sdpa`) and each
batched ``matmul`` of activations (:mod:`.matmul`, the eager way to write attention) rewritten
into ops XNNPACK takes, where that is exact and XNNPACK takes all of them; the others are left as
they were, and say why. ``explain`` lists each as an :class:`AttentionRewrite`."""

from __future__ import annotations

from torch.export import ExportedProgram

from . import matmul, sdpa
from .common import AttentionRewrite
from .sdpa import CAUSAL, KEEP_FACTOR, NO_MASK, SDPA

__all__ = ["AttentionRewrite", "CAUSAL", "KEEP_FACTOR", "NO_MASK", "SDPA", "rewrite_attention"]


def rewrite_attention(program: ExportedProgram) -> list:
    """Rewrite, in place, every SDPA and batched ``matmul`` node of ``program`` (the pass's own
    copy) that XNNPACK takes whole once rewritten; return an :class:`AttentionRewrite` for each
    such node, rewritten or kept."""
    graph, records = program.graph, []
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is SDPA:
            step, op = sdpa, "attention"
        elif matmul.is_batched(node):
            step, op = matmul, "matmul"
        else:
            continue
        reason = step.why_kept(node)
        if reason is None:
            records.append(AttentionRewrite(node.name, proven=step.rewrite_one(graph, node),
                                            op=op))
        else:
            records.append(AttentionRewrite(node.name, kept_because=reason, op=op))
    if any(r.rewritten for r in records):
        graph.lint()
        program.graph_module.recompile()
    return records
