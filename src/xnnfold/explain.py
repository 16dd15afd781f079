"""Explain: for every GEMM weight and bias, delegated as is, folded, or declined and why (and
whether it is delegated with a run-time weight); then what each step of the pass did, by the
step's name, one line per site it looked at (an attention rewritten or kept and why, a GEMM
rewritten as ``linear``, a packed projection split or kept, ...)."""

from __future__ import annotations

from typing import Optional

from torch.export import ExportedProgram

from .partitioner import XnnpackPartitioner, fold_gemm_params
from .pipeline import STEPS


class Explanation(list):
    """The :class:`~xnnfold.result.GemmOperand` rows, plus ``records`` (each step's records, by
    step name: :attr:`xnnfold.result.FoldResult.records`) and ``fallback``."""

    def __init__(self, rows, records: Optional[dict] = None, fallback: Optional[str] = None):
        super().__init__(rows)
        self.records = dict(records or {})
        self.fallback = fallback

    @classmethod
    def of(cls, result) -> "Explanation":
        """The explanation of a :class:`~xnnfold.result.FoldResult`."""
        return cls(result.operands, result.records, result.fallback)


def explain(ep: ExportedProgram, partitioner=None) -> Explanation:
    """What ``fold_gemm_params(ep)`` does, row by GEMM operand.

    Pass the :class:`~xnnfold.XnnpackPartitioner` that lowered ``ep`` to read what that
    lowering decided (its ``last_result``) instead of folding again; otherwise this costs one
    fold. If the fold fell back to stock, the operands it would have folded say so (rule
    "internal").
    """
    result = None
    if isinstance(partitioner, XnnpackPartitioner):
        result = partitioner.result_for(ep)
    if result is None:
        result = fold_gemm_params(ep, partitioner)
    return Explanation.of(result)


def format_explanation(rows: list, fallback: Optional[str] = None,
                       records: Optional[dict] = None) -> str:
    """A table of ``rows``; then each step's records, in the order the steps ran, with the
    step's summary line if it has one; then the fallback, if any. ``records`` and ``fallback``
    default to those of an :class:`Explanation`."""
    records = records if records is not None else getattr(rows, "records", {})
    fallback = fallback or getattr(rows, "fallback", None)
    table = [[r.gemm, r.module or "", r.kind, r.role, r.status, r.rule or "",
              r.node or r.constant or "", r.reason or ""] for r in rows]
    text = columns(["gemm", "module (class)", "kind", "operand", "status", "rule",
                     "node / constant", "reason"], table) if table else "no GEMM"
    steps = {step.name: step for step in STEPS}
    for name, step_records in records.items():
        for record in step_records:
            text += f"\n{record.describe()}"
        summary = getattr(steps.get(name), "summary", None)
        line = summary(step_records) if summary is not None else None
        if line:
            text += f"\n{line}"
    if fallback:
        text += f"\nxnnfold fell back to stock: {fallback}"
    return text


def columns(headers: list, rows: list) -> str:
    """A plain text table, left-aligned, a rule under the headers."""
    cells = [[str(c) for c in row] for row in [headers] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
