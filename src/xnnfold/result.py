"""What the pass returns: the program to lower and one row per GEMM weight and bias saying
what was done with it and why (:class:`FoldResult`, :class:`GemmOperand`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch.export import ExportedProgram

from . import rules
from .analysis.gemms import source_module
from .decision import Decline, Found, Rule, Status


@dataclass
class GemmOperand:
    """One weight or bias of one GEMM, and what xnnfold did with it."""

    gemm: str
    kind: str
    role: str
    status: Status
    rule: Optional[Rule] = None       # for declined: the rule
    node: Optional[str] = None        # for declined: the node that broke it
    reason: Optional[str] = None
    constant: Optional[str] = None    # for folded: the constant's name
    # for folded: False when XNNPACK does not take the GEMM; its part was folded with the rest
    # of its group so that the packed param is freed, and the GEMM reads it on portable
    delegated: Optional[bool] = None
    runtime_weight: bool = False      # delegated with its weight as a run-time input
    module: Optional[str] = None      # the user's module it came from: "path (Class)"
    # a weight where speed and size trade (a tied head): the bytes the run-time weight
    # (prefer="size") stores less than stock's constant copy, which prefer="speed" keeps
    size_option_bytes: Optional[int] = None


@dataclass
class FoldResult:
    """What ``fold_gemm_params`` returns: the program to lower and the record of the fold."""

    program: ExportedProgram
    operands: list = field(default_factory=list)      # GemmOperand, in graph order
    constants: list = field(default_factory=list)     # FoldedConstant
    freed_params: list = field(default_factory=list)
    projections: list = field(default_factory=list)  # PackedProjection, split or kept
    canonical: list = field(default_factory=list)    # CanonicalRewrite
    attention: list = field(default_factory=list)    # AttentionRewrite, rewritten or kept
    mask_index: list = field(default_factory=list)   # MaskIndexRewrite
    kv_cache: list = field(default_factory=list)     # KVCacheRewrite, rewritten or kept
    gelu_tanh: list = field(default_factory=list)    # TanhGeluRewrite, rewritten or kept
    probe_rounds: int = 0
    fallback: Optional[str] = None    # set when an internal failure sent us back to stock
    modified: bool = False            # False when ``program`` is the input, untouched

    @property
    def folded(self) -> list:
        return [o for o in self.operands if o.status == Status.FOLDED]

    @property
    def declined(self) -> list:
        return [o for o in self.operands if o.status == Status.DECLINED]

    @property
    def split_projections(self) -> list:
        """The packed projections that were split (the others say why they were kept)."""
        return [p for p in self.projections if p.kept_because is None]


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
