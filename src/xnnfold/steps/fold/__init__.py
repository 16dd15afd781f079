"""The fold step: the static computation of each GEMM's weight and bias, folded into constants.

In one place: MHA's packed in-projections split into one linear per part
(:mod:`xnnfold.steps.projections`), the operands analysed (:mod:`xnnfold.analysis`), the nodes
to fold planned in groups (:mod:`.plan`), judged by the rules (:mod:`.rules`) and by XNNPACK's
verdict (the probe, :mod:`.probe`), evaluated (:mod:`.evaluate`) and folded into a copy of the
program (:mod:`.apply`); folded again without the groups XNNPACK takes none of, until the probe
agrees; and each split whose parts were not all folded and delegated undone (rule *split*), so
that each site ends either fully split, folded and delegated, or exactly as it was.

Its records: each packed projection (split or kept) and a :class:`FoldSummary`; it sets the
context's ``operands`` (one row per GEMM weight and bias), ``constants``, ``freed_params`` and
``probe_rounds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch.export import ExportedProgram

from ...analysis import ProgramFacts, find_operands, find_static
from ...decision import Found
from ...graph.program_copy import copy_with_nodes
from .rows import describe
from ..projections import find_packed_projections, split_packed_projections
from ..protocol import Context, Outcome, Probe
from . import plan, rules
from .apply import Folded, apply_folds
from .evaluate import ConeEvaluator


@dataclass(frozen=True)
class FoldSummary:
    """What the fold put into the program and took out of it."""

    constants: tuple = ()          # the folded constants' names
    freed_params: tuple = ()       # the params nothing reads any more, dropped
    probe_rounds: int = 0

    @property
    def rewritten(self) -> bool:
        return bool(self.constants)

    def describe(self) -> str:
        if not self.constants:
            return "fold step: nothing folded"
        return (f"fold step: {len(self.constants)} constant(s) folded; freed params: "
                f"{', '.join(self.freed_params) or 'none'}; probe rounds: {self.probe_rounds}")


@dataclass
class _Round:
    """One fold of a program: the program and the record of it."""

    program: ExportedProgram
    operands: list
    folded: Optional[Folded] = None
    probe_rounds: int = 0
    constants: list = field(default_factory=list)


def fold_and_probe(facts: ProgramFacts, probe: Optional[Probe], rule_set) -> _Round:
    """Plan and fold ``facts.ep``; ask the probe which GEMMs XNNPACK takes, and fold again
    without the groups it takes none of, until the probe agrees. Each round folds into a fresh
    copy of ``facts.ep``; values are evaluated once, for all rounds."""
    program = facts.ep
    operands = find_operands(program, facts)
    targets = [op.target for op in operands if op.status == Found.TARGET]
    groups = plan.group_fold_nodes(plan.fold_nodes(targets))
    rules.apply(groups, facts, rule_set.before_probe)
    evaluator = ConeEvaluator(facts)

    folded, rounds = None, 0
    # Each round that changes anything declines at least one more group: this terminates.
    for _ in range(len(groups) + 1):
        members = [m for g in groups for m in g.to_fold]
        if not members:
            folded = None
            break
        folded = apply_folds(program, evaluator, members)
        if probe is None:
            break
        rounds += 1
        names = {c.source: c.name for c in folded.constants}
        taken = probe(folded.program, folded.constants)
        for member in members:
            member.delegated = names[member.name] in taken
        if not rules.apply(groups, facts, rule_set.after_probe):
            break
    names = {c.source: c.name for c in folded.constants} if folded else {}
    return _Round(folded.program if folded else program, describe(operands, groups, names),
                  folded, rounds)


class FoldStep:
    name = "fold"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        facts = find_static(program)
        sites, kept = find_packed_projections(facts), []
        while True:
            program_facts = facts
            if sites:   # a split round: a copy of the program, split and analysed
                split, nodes = copy_with_nodes(program)
                split_packed_projections(split, sites, nodes)
                context.check(split, "projections")
                program_facts = find_static(split)
            done = fold_and_probe(program_facts, context.probe, context.rules)
            context.check(done.program, self.name)
            rows = {(row.gemm, row.role): row for row in done.operands}
            newly_kept = [s for s in sites if _kept(s, rows)]
            if not newly_kept:
                break
            kept += newly_kept
            sites = [s for s in sites if s not in newly_kept]
        for site in kept:
            site.part_linears = {}
        folded = done.folded
        context.operands = done.operands
        context.constants = folded.constants if folded else []
        context.freed_params = folded.freed_params if folded else []
        context.probe_rounds = done.probe_rounds
        summary = FoldSummary(tuple(c.name for c in context.constants),
                              tuple(context.freed_params), done.probe_rounds)
        return Outcome(sites + kept + [summary], done.program)


def _kept(site, rows: dict) -> bool:
    site.kept_because = rules.split_kept(site, rows)
    return site.kept_because is not None


STEP = FoldStep()
