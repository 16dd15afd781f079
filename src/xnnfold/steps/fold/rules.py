"""Rules: which planned groups are folded, each rule one small function with one signature.

A rule sees a :class:`~xnnfold.steps.fold.plan.Group` and the program's facts and returns the declines it
makes, ``{member: Decline}``; its docstring names the failure it prevents. A
:class:`RuleSet` says which rules run before the probe and which after it (once every member
knows whether XNNPACK takes its GEMM); tests pass a reduced set to show a rule is load-bearing.
Two decisions are not about groups and keep their own shape, but live here and speak in the
same :class:`Decline`: an operand that is not static at all, and a packed projection split
that is undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ...analysis import ProgramFacts
from ...analysis.gemms import op_name
from ...decision import Decline, Rule, Status
from ...graph.node_meta import tensor_val
from .plan import Group, freed_nodes


RuleFn = Callable[[Group, ProgramFacts], dict]


def _rule(name: Rule):
    def tag(fn):
        fn.rule = name
        return fn
    return tag


def _all(group: Group, decline: Decline) -> dict:
    return {m: decline for m in group.to_fold}


@_rule(Rule.EXACT)
def exact(group: Group, facts: ProgramFacts) -> dict:
    """A folded value must equal what eager computes, bit for bit.

    Prevents folding a random op (``rand_like``, ``dropout`` in train mode, ``bernoulli``):
    evaluated once at lowering time, it would freeze one draw where eager draws anew.
    """
    declines = {}
    for member in group.to_fold:
        random = next((n for n in member.cone if torch.Tag.nondeterministic_seeded in
                       getattr(n.target, "tags", ())), None)
        if random is not None:
            declines[member] = Decline(Rule.EXACT, random.name,
                                       f"{op_name(random.target)} draws random numbers; a "
                                       "folded value would freeze one draw")
    return declines


@_rule(Rule.WHOLE_GROUP)
def whole_group(group: Group, facts: ProgramFacts) -> dict:
    """The parts of one multi-output op are folded together or not at all.

    Prevents storing a packed param twice: folding some parts of a ``split`` leaves the split,
    and so the whole param, in the program for the others.
    """
    first = next((m for m in group.members if m.decline is not None), None)
    if first is None:
        return {}
    return _all(group, Decline(Rule.WHOLE_GROUP, first.decline.node,
                               f"folded together with {first.name}, which is declined by "
                               f"rule '{first.decline.rule}'"))


def _nbytes(node) -> int:
    val = tensor_val(node)
    return val.numel() * val.element_size() if val is not None else 0


@_rule(Rule.SIZE)
def size(group: Group, facts: ProgramFacts) -> dict:
    """The folded tensors together may be no larger than the params they free.

    Prevents the .pte from growing: a part also read by a non-GEMM op keeps its param alive, so
    folding it would store the param twice; parts that overlap or repeat (``cat([W, W])``) are
    larger than what they come from.
    """
    if not group.to_fold:
        return {}
    folded = sum(_nbytes(m.node) for m in group.members)
    dead = freed_nodes(group)
    freed = sum(value.numel() * value.element_size()
                for node, value in facts.placeholder_values.items() if node in dead)
    if folded <= freed:
        return {}
    kept = [m.name for m in group.members if m.node not in dead]
    return _all(group, Decline(Rule.SIZE, kept[0] if kept else group.members[0].name,
                               f"folded tensors take {folded:,} bytes but free only "
                               f"{freed:,} bytes of params (a param stays alive for another "
                               "user)"))


@_rule(Rule.DELEGATED)
def delegated(group: Group, facts: ProgramFacts) -> dict:
    """Fold a group only if XNNPACK then takes at least one of its GEMMs.

    Prevents moving work off a path stock leaves alone: GEMMs XNNPACK declines anyway (dtype,
    precision, dynamic shape, rank, conv kind) would gain nothing, and what stays on portable
    stays exactly as stock leaves it. A group of which XNNPACK takes *some* GEMMs is folded
    whole: the size rule has checked that folding every part frees the packed param, and the
    GEMMs XNNPACK declines read their constant part on portable. Decided on the real
    partitioner's answer (``member.delegated``, set from the probe).
    """
    if not group.to_fold or any(m.delegated for m in group.to_fold):
        return {}
    target = group.to_fold[0].targets[0]
    return _all(group, Decline(Rule.DELEGATED, target.gemm.name,
                               f"XNNPACK does not take {target.gemm.name} even with a "
                               f"constant {target.role}"))


@dataclass(frozen=True)
class RuleSet:
    """The rules in the order they run: ``before_probe`` on the plan, ``after_probe`` once the
    probe has said which GEMMs XNNPACK takes."""

    before_probe: tuple = (exact, whole_group, size)
    after_probe: tuple = (delegated, whole_group)
    # Where an option trades speed for size (a tied head: stock's constant copy, or a run-time
    # weight that stores the table once but is repacked on every call): "speed" keeps stock's
    # choice, "size" takes the smaller .pte. See xnnfold.steps.runtime_weight.
    prefer: str = "speed"

    def __post_init__(self):
        if self.prefer not in PREFER:
            raise ValueError(f"prefer must be one of {', '.join(PREFER)}, got {self.prefer!r}")

    def without(self, *names: Rule) -> "RuleSet":
        keep = lambda rules: tuple(r for r in rules if r.rule not in names)  # noqa: E731
        return RuleSet(keep(self.before_probe), keep(self.after_probe), self.prefer)

    def preferring(self, prefer: Optional[str]) -> "RuleSet":
        """These rules with ``prefer`` (``None``: as they are)."""
        if prefer is None:
            return self
        return RuleSet(self.before_probe, self.after_probe, prefer)


PREFER = ("speed", "size")


DEFAULT_RULES = RuleSet()


def apply(groups: list, facts: ProgramFacts, rules: tuple) -> bool:
    """Run ``rules`` on every group, in order; True if any member got a decline."""
    changed = False
    for group in groups:
        for rule in rules:
            for member, decline in rule(group, facts).items():
                if member.decline is None:
                    member.decline = decline
                    changed = True
    return changed


def static(culprit: str, why: str) -> Decline:
    """A GEMM operand computed from a user input or a mutable buffer is not a fold target.

    Prevents folding anything whose value changes between calls.
    """
    return Decline(Rule.STATIC, culprit, f"computed from {culprit}, which {why}")


def split_kept(site, rows: dict) -> Optional[Decline]:
    """A packed projection stays split only if every part's linear is folded and delegated.

    Prevents the row blocks of the param from staying on portable next to linears stock never
    had. A part with no weight row at all (analysis did not take it for a GEMM) is not folded
    either.
    """
    for part in site.part_linears.values():
        if (part, "weight") not in rows:
            return Decline(Rule.SPLIT, part, f"{part} has no weight operand to fold")
        for role in ("weight", "bias"):
            row = rows.get((part, role))
            if row is not None and row.status != Status.FOLDED:
                return Decline(Rule.SPLIT, part, f"{row.gemm}.{row.role} was {row.status}" + (
                    f" by rule '{row.rule}' ({row.reason})" if row.rule else ""))
            if row is not None and row.delegated is False:
                return Decline(Rule.SPLIT, part, f"XNNPACK does not take {row.gemm}")
    return None
