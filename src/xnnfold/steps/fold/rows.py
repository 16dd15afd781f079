"""The one place an analysis :class:`~xnnfold.analysis.Operand` becomes a
:class:`~xnnfold.result.GemmOperand` row: plain, folded (with its constant) or declined (with the
rule, the node and the reason)."""

from __future__ import annotations

from typing import Optional

from ...analysis.gemms import source_module
from ...decision import Decline, Found, Status
from ...result import GemmOperand
from . import rules


def row_of(op, decline: Optional[Decline] = None, member=None,
         constant: Optional[str] = None) -> GemmOperand:
    """The one place an analysis :class:`~xnnfold.analysis.Operand` becomes a row."""
    row = GemmOperand(op.gemm.name, op.kind, op.role, Status.PLAIN, reason=op.reason,
                      module=source_module(op.gemm))
    if decline is not None:
        row.status, row.rule = Status.DECLINED, decline.rule
        row.node, row.reason = decline.node, decline.reason
    elif member is not None:
        row.status, row.constant, row.delegated = Status.FOLDED, constant, member.delegated
        if member.delegated is False:
            row.reason = (f"XNNPACK does not take {op.gemm.name}; its part is folded with the "
                          "rest of its group, which frees the packed param, and read on "
                          "portable")
    return row


def describe(operands: list, groups: list, constants: dict) -> list:
    members = {t.key: m for g in groups for m in g.members for t in m.targets}
    rows = []
    for op in operands:
        if op.status == Found.DYNAMIC:
            rows.append(row_of(op, rules.static(op.culprit, op.reason)))
        elif op.status == Found.TARGET:
            member = members[op.target.key]
            rows.append(row_of(op, member.decline, member, constants.get(member.name)))
        else:
            rows.append(row_of(op))
    return rows
