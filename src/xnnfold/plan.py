"""Plan: group the fold targets, and decide by rules which groups are folded.

A *group* is a set of fold targets that must be decided together: targets whose cones share a
node (the parts of one ``split``) or read the same param (folding one of them alone frees
nothing). Each rule is one small function returning a :class:`Decline` (or None), and its
docstring names the failure it prevents. Rules that need the lowered program (``delegated``)
run after a probe; see :mod:`xnnfold.probe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch
import torch.fx

from .analysis import FoldTarget, ProgramFacts, is_metadata_assertion
from .gemms import op_name


@dataclass(frozen=True)
class Decline:
    """Why a target is not folded: the rule, the node that broke it, and a sentence."""

    rule: str
    node: str
    reason: str


@dataclass
class FoldNode:
    """One node whose value becomes a constant, and the nodes that will read the constant."""

    node: torch.fx.Node
    consumers: list                          # GEMMs, or the dequantize in front of one
    targets: list                            # the FoldTargets (operands) it serves
    cone: list                               # static call_function nodes, graph order
    decline: Optional[Decline] = None
    delegated: Optional[bool] = None         # set by the probe: does XNNPACK take its GEMM?

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class Group:
    members: list = field(default_factory=list)   # FoldNodes

    @property
    def declined(self) -> bool:
        return any(m.decline is not None for m in self.members)


def _nbytes(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


# --------------------------------------------------------------------------------------------
# Grouping


def fold_nodes(targets: Iterable[FoldTarget]) -> list:
    """One FoldNode per distinct node to fold (two GEMMs may read the same computed weight)."""
    by_name: dict = {}
    for target in targets:
        consumer = target.through_dequantize or target.gemm
        entry = by_name.get(target.node.name)
        if entry is None:
            entry = by_name[target.node.name] = FoldNode(target.node, [], [], target.cone)
        if consumer not in entry.consumers:
            entry.consumers.append(consumer)
        entry.targets.append(target)
    return list(by_name.values())


def group_fold_nodes(nodes: list) -> list:
    """Connected components of fold nodes linked by a shared cone node or a shared input."""
    parent = list(range(len(nodes)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict = {}
    for index, entry in enumerate(nodes):
        touched = {n.name for n in entry.cone}
        touched |= {i.name for n in entry.cone for i in n.all_input_nodes}
        for name in touched:
            if name in owner:
                parent[find(index)] = find(owner[name])
            else:
                owner[name] = index
    groups: dict = {}
    for index, entry in enumerate(nodes):
        groups.setdefault(find(index), Group()).members.append(entry)
    return list(groups.values())


# --------------------------------------------------------------------------------------------
# What folding a group would remove


def freed_nodes(group: Group) -> set:
    """Names of the nodes (cone nodes and params) left with no user once ``group`` is folded.

    A folded node's consumers read the constant instead; every other user keeps the node (and
    so its inputs) alive. A part also used by a non-GEMM op therefore frees nothing.
    """
    rewired = {m.name: {c.name for c in m.consumers} for m in group.members}
    candidates = {n.name: n for m in group.members for n in m.cone}
    for node in list(candidates.values()):
        for source in node.all_input_nodes:
            if source.op == "placeholder":
                candidates[source.name] = source
    order = {n.name: i for i, n in enumerate(next(iter(candidates.values())).graph.nodes)} \
        if candidates else {}
    dead: set = set()
    for name in sorted(candidates, key=order.get, reverse=True):
        node = candidates[name]
        skip = rewired.get(name, set())
        if all(u.name in dead or u.name in skip or is_metadata_assertion(u)
               for u in node.users):
            dead.add(name)
    return dead


# --------------------------------------------------------------------------------------------
# Rules. Each returns a Decline for the first member that breaks it, or None.


def rule_exact(member: FoldNode, facts: ProgramFacts) -> Optional[Decline]:
    """A folded value must equal what eager computes, bit for bit.

    Prevents folding a random op (``rand_like``, ``dropout`` in train mode, ``bernoulli``):
    evaluated once at lowering time, it would freeze one draw where eager draws anew.
    """
    for node in member.cone:
        tags = getattr(node.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            return Decline("exact", node.name,
                           f"{op_name(node.target)} draws random numbers; a folded value "
                           "would freeze one draw")
    return None


def rule_size(group: Group, facts: ProgramFacts) -> Optional[Decline]:
    """The folded tensors together may be no larger than the params they free.

    Prevents the .pte from growing: a part also read by a non-GEMM op keeps its param alive, so
    folding it would store the param twice; parts that overlap or repeat (``cat([W, W])``) are
    larger than what they come from.
    """
    folded = sum(_nbytes(m.node) for m in group.members)
    dead = freed_nodes(group)
    freed = sum(value.numel() * value.element_size()
                for name, value in facts.placeholder_values.items() if name in dead)
    if folded <= freed:
        return None
    kept = [m.name for m in group.members if m.name not in dead]
    culprit = kept[0] if kept else group.members[0].name
    return Decline("size", culprit,
                   f"folded tensors take {folded:,} bytes but free only {freed:,} bytes of "
                   "params (a param stays alive for another user)")


def rule_delegated(group: Group) -> Optional[Decline]:
    """Fold a group only if XNNPACK then takes at least one of its GEMMs.

    Prevents moving work off a path stock leaves alone: GEMMs XNNPACK declines anyway (dtype,
    precision, dynamic shape, rank, conv kind) would gain nothing, and what stays on portable
    stays exactly as stock leaves it. A group of which XNNPACK takes *some* GEMMs is folded
    whole: the size rule has checked that folding every part frees the packed param, and the
    GEMMs XNNPACK declines read their constant part on portable. Decided on the real
    partitioner's tags (``member.delegated``).
    """
    if any(m.delegated for m in group.members):
        return None
    gemm = group.members[0].targets[0].gemm
    return Decline("delegated", gemm.name,
                   f"XNNPACK does not take {gemm.name} even with a constant "
                   f"{group.members[0].targets[0].role}")


def rule_whole_group(group: Group) -> None:
    """The parts of one multi-output op are folded together or not at all.

    Prevents storing a packed param twice: folding some parts of a ``split`` leaves the split,
    and so the whole param, in the program for the others.
    """
    first = next((m for m in group.members if m.decline is not None), None)
    if first is None:
        return
    for member in group.members:
        if member.decline is None:
            member.decline = Decline(
                "whole-group", first.decline.node,
                f"folded together with {first.name}, which is declined by rule "
                f"'{first.decline.rule}'")


# The rules that need no lowering, in the order they are applied. Tests remove one at a time.
MEMBER_RULES = [rule_exact]
GROUP_RULES = [rule_size]
GROUP_CLOSURE = [rule_whole_group]


def apply_static_rules(groups: list, facts: ProgramFacts) -> None:
    for group in groups:
        for member in group.members:
            for rule in MEMBER_RULES:
                member.decline = member.decline or rule(member, facts)
        for close in GROUP_CLOSURE:
            close(group)
        if group.declined:
            continue
        for rule in GROUP_RULES:
            decline = rule(group, facts)
            if decline is not None:
                for member in group.members:
                    member.decline = member.decline or decline
                break


def apply_delegated_rule(groups: list, constants: dict, taken: set) -> bool:
    """Decline the groups of which XNNPACK takes no GEMM; True if anything changed."""
    changed = False
    for group in groups:
        if group.declined:
            continue
        for member in group.members:
            member.delegated = constants[member.name] in taken
        decline = rule_delegated(group)
        if decline is not None:
            for member in group.members:
                member.decline = decline
            changed = True
    return changed
