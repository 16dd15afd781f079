"""The whole pass: analysis -> plan -> fold -> probe, repeated until the probe agrees.

``run`` never raises for a failure of its own: it logs one warning naming the node and the
reason and returns the input program untouched, which lowers exactly as stock lowers it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from . import plan
from .analysis import find_operands, find_static
from .canonical import canonicalize, rewritable
from .runtime_weight import mark_runtime_weights
from .errors import FoldError
from .fold import apply_folds, copy_program
from .projections import find_packed_projections, split_packed_projections

logger = logging.getLogger("xnnfold")

# A probe answers: which of these folded constants (fold.FoldedConstant) of this program end up
# in a delegate? (state_dict / constants keys; see xnnfold.verified_probe)
Probe = Callable[[ExportedProgram, list], set]

# The probe can only shrink the folded set, so this bounds a loop that ends in 1-2 rounds.
_MAX_PROBE_ROUNDS = 4


@dataclass
class GemmOperand:
    """One weight or bias of one GEMM, and what xnnfold did with it."""

    gemm: str
    kind: str
    role: str
    status: str                       # "plain", "folded" or "declined"
    rule: Optional[str] = None        # for declined: the rule
    node: Optional[str] = None        # for declined: the node that broke it
    reason: Optional[str] = None
    constant: Optional[str] = None    # for folded: the constant's name
    # for folded: False when XNNPACK does not take the GEMM; its part was folded with the rest
    # of its group so that the packed param is freed, and the GEMM reads it on portable
    delegated: Optional[bool] = None
    runtime_weight: bool = False      # delegated with its weight as a run-time input


@dataclass
class FoldResult:
    """What ``fold_gemm_params`` returns: the program to lower and the record of the fold."""

    program: ExportedProgram
    operands: list = field(default_factory=list)      # GemmOperand, in graph order
    constants: list = field(default_factory=list)     # FoldedConstant
    freed_params: list = field(default_factory=list)
    projections: list = field(default_factory=list)  # PackedProjection, split or kept
    canonical: list = field(default_factory=list)    # CanonicalRewrite
    probe_rounds: int = 0
    fallback: Optional[str] = None    # set when an internal failure sent us back to stock

    @property
    def folded(self) -> list:
        return [o for o in self.operands if o.status == "folded"]

    @property
    def declined(self) -> list:
        return [o for o in self.operands if o.status == "declined"]

    @property
    def split_projections(self) -> list:
        """The packed projections that were split (the others say why they were kept)."""
        return [p for p in self.projections if p.kept_because is None]


def _describe(operands: list, groups: list, constants: dict) -> list:
    members = {t.key: m for g in groups for m in g.members for t in m.targets}
    described = []
    for op in operands:
        row = GemmOperand(op.gemm.name, op.kind, op.role, "plain", reason=op.reason)
        if op.status == "dynamic":
            row.status, row.rule, row.node = "declined", "static", op.culprit
            row.reason = f"computed from {op.culprit}, which {op.reason}"
        elif op.status == "target":
            member = members[op.target.key]
            if member.decline is None:
                row.status, row.constant = "folded", constants.get(member.name)
                row.delegated = member.delegated
                if member.delegated is False:
                    row.reason = (f"XNNPACK does not take {op.gemm.name}; its part is folded "
                                  "with the rest of its group, which frees the packed param, "
                                  "and read on portable")
            else:
                row.status = "declined"
                row.rule, row.node = member.decline.rule, member.decline.node
                row.reason = member.decline.reason
        described.append(row)
    return described


def unfolded_part(site, rows: dict) -> Optional[str]:
    """Why one of ``site``'s part linears is not folded, or None when all of them are.

    A split is kept only when every part is folded (and so delegated): otherwise the row
    blocks of the param would stay on portable, next to linears stock never had. A part with no
    weight row at all (analysis did not take it for a GEMM) is not folded either.
    """
    for part in site.part_linears.values():
        if (part, "weight") not in rows:
            return f"{part} has no weight operand to fold"
        for role in ("weight", "bias"):
            row = rows.get((part, role))
            if row is not None and row.status != "folded":
                return f"{row.gemm}.{row.role} was {row.status}" + (
                    f" by rule '{row.rule}' ({row.reason})" if row.rule else "")
            if row is not None and row.delegated is False:
                return f"XNNPACK does not take {row.gemm}"
    return None


def _fold_and_probe(ep: ExportedProgram, probe: Optional[Probe]) -> FoldResult:
    """Split packed projections, then fold; undo each split whose parts were not all folded.

    Each site thus ends either fully split, folded and delegated, or exactly as it was.
    """
    base, facts, rewrites = ep, find_static(ep), []
    if rewritable(ep, facts.static):
        base = copy_program(ep)
        rewrites = canonicalize(base, facts.static)
        facts = find_static(base)
    sites, kept = find_packed_projections(facts), []
    while True:
        program = base
        if sites:
            program = copy_program(base)
            split_packed_projections(program, sites)
        result = _fold_program(program, probe)
        rows = {(row.gemm, row.role): row for row in result.operands}
        newly_kept = []
        for site in sites:
            reason = unfolded_part(site, rows)
            if reason is not None:
                site.kept_because = reason
                newly_kept.append(site)
        if not newly_kept:
            break
        kept += newly_kept
        sites = [s for s in sites if s not in newly_kept]
    for site in kept:
        site.part_linears = {}
    result.projections = sites + kept
    result.canonical = rewrites
    return mark_runtime_weights(ep, result)


def _fold_program(ep: ExportedProgram, probe: Optional[Probe]) -> FoldResult:
    facts = find_static(ep)
    operands = find_operands(ep, facts)
    targets = [op.target for op in operands if op.status == "target"]
    groups = plan.group_fold_nodes(plan.fold_nodes(targets))
    plan.apply_static_rules(groups, facts)

    folded, rounds = None, 0
    while True:
        members = [m for g in groups if not g.declined for m in g.members]
        if not members:
            folded = None
            break
        folded = apply_folds(ep, facts, members)
        if probe is None or rounds >= _MAX_PROBE_ROUNDS:
            break
        rounds += 1
        constants = {c.source: c.name for c in folded.constants}
        taken = probe(folded.program, folded.constants)
        if not plan.apply_delegated_rule(groups, constants, taken):
            break

    constants = {c.source: c.name for c in folded.constants} if folded else {}
    result = FoldResult(folded.program if folded else ep,
                        _describe(operands, groups, constants), probe_rounds=rounds)
    if folded:
        result.constants, result.freed_params = folded.constants, folded.freed_params
    return result


def stored_bytes(ep: ExportedProgram) -> int:
    """Bytes of the params, buffers and lifted constants ``ep``'s signature lists."""
    tensors = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if isinstance(value, torch.Tensor):
                tensors[spec.target] = value.numel() * value.element_size()
    return sum(tensors.values())


def check_no_growth(ep: ExportedProgram, result: FoldResult) -> None:
    """The promise that the .pte never grows, kept by the result rather than by the rules:
    whatever the rules missed, a fold that stores more than the input is not returned."""
    if result.program is ep:
        return
    before, after = stored_bytes(ep), stored_bytes(result.program)
    if after > before:
        raise FoldError("<program>", f"the folded program would store {after:,} bytes of "
                                     f"params and constants, more than the input's {before:,}")


def run(ep: ExportedProgram, probe: Optional[Probe]) -> FoldResult:
    """Fold what the rules allow; on any internal failure, warn once and return ``ep``."""
    try:
        result = _fold_and_probe(ep, probe)
        check_no_growth(ep, result)
        return result
    except FoldError as error:
        where, why = error.node, error.reason
    except Exception as error:  # noqa: BLE001 - never fail a lowering stock would pass
        where, why = "<program>", f"{type(error).__name__}: {error}"
    logger.warning("xnnfold: folding skipped at node %r: %s; lowering as the stock "
                   "XnnpackPartitioner would", where, why)
    return FoldResult(ep, _unfolded_rows(ep, where, why), fallback=f"at node {where!r}: {why}")


def _unfolded_rows(ep: ExportedProgram, where: str, why: str) -> list:
    """After a fallback, still say what each GEMM operand is, if analysis alone can."""
    try:
        operands = find_operands(ep)
    except Exception:  # noqa: BLE001 - the warning already names the failure
        return []
    return [GemmOperand(o.gemm.name, o.kind, o.role, "plain") if o.status == "plain" else
            GemmOperand(o.gemm.name, o.kind, o.role, "declined", "internal", where, why)
            for o in operands]

