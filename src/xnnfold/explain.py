"""Explain: for every GEMM weight and bias, delegated as is, folded, or declined and why."""

from __future__ import annotations

from typing import Optional

from tabulate import tabulate
from torch.export import ExportedProgram

from .partitioner import fold_gemm_params

_STATUS_TEXT = {"plain": "plain param (stock delegates it as is)",
                "folded": "folded into a constant",
                "declined": "declined"}


def explain(ep: ExportedProgram, partitioner=None) -> list:
    """The :class:`~xnnfold.pipeline.GemmOperand` rows of ``fold_gemm_params(ep)``.

    Raises nothing the fold would not: if the fold fell back to stock, every row says so.
    """
    result = fold_gemm_params(ep, partitioner)
    if result.fallback:
        for row in result.operands:
            row.status, row.rule, row.reason = "declined", "internal", result.fallback
    return result.operands


def format_explanation(rows: list, fallback: Optional[str] = None) -> str:
    table = [[r.gemm, r.kind, r.role, r.status, r.rule or "", r.node or r.constant or "",
              r.reason or ""] for r in rows]
    text = tabulate(table, headers=["gemm", "kind", "operand", "status", "rule",
                                    "node / constant", "reason"]) if table else "no GEMM"
    if fallback:
        text += f"\nxnnfold fell back to stock: {fallback}"
    return text
