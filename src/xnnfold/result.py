"""What the pass returns: the program to lower, one row per GEMM weight and bias saying what was
done with it and why (:class:`GemmOperand`), and each step's records (:class:`FoldResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch.export import ExportedProgram

from .decision import Rule, Status


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
    """What ``fold_gemm_params`` returns: the program to lower and the record of the fold.

    ``records``: each step's records, by step name, in the order the steps ran (a step that
    did not run has none); ``modified`` is derived from them: a record that rewrote. The
    pipeline holds each step's records to what it changed in the graph (a change no record
    reports is a failure of the pass), so ``modified`` is what the program shows."""

    program: ExportedProgram
    operands: list = field(default_factory=list)      # GemmOperand, in graph order
    records: dict = field(default_factory=dict)       # step name -> its records
    constants: list = field(default_factory=list)     # FoldedConstant
    freed_params: list = field(default_factory=list)
    probe_rounds: int = 0
    fallback: Optional[str] = None    # set when an internal failure sent us back to stock

    def of(self, step: str) -> list:
        """The records of the step named ``step`` (none if it did not run)."""
        return list(self.records.get(step, ()))

    @property
    def modified(self) -> bool:
        """Whether ``program`` is a rewrite (else it is the input, untouched)."""
        return any(r.rewritten for records in self.records.values() for r in records)

    @property
    def folded(self) -> list:
        return [o for o in self.operands if o.status == Status.FOLDED]

    @property
    def declined(self) -> list:
        return [o for o in self.operands if o.status == Status.DECLINED]
