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

    If the fold fell back to stock, the operands it would have folded say so (rule "internal").
    """
    return fold_gemm_params(ep, partitioner).operands


def format_explanation(rows: list, fallback: Optional[str] = None) -> str:
    table = [[r.gemm, r.kind, r.role, r.status, r.rule or "", r.node or r.constant or "",
              r.reason or ""] for r in rows]
    text = tabulate(table, headers=["gemm", "kind", "operand", "status", "rule",
                                    "node / constant", "reason"]) if table else "no GEMM"
    if fallback:
        text += f"\nxnnfold fell back to stock: {fallback}"
    return text
