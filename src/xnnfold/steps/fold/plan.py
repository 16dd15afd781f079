"""Plan: group the fold targets, and say what folding a group would free.

A *group* is a set of fold targets that must be decided together: targets whose cones share a
node (the parts of one ``split``) or read the same param (folding one of them alone frees
nothing). Which groups are folded is decided by :mod:`xnnfold.steps.fold.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch.fx

from ...analysis import FoldTarget, is_metadata_assertion
from ...decision import Decline


@dataclass(eq=False)   # identity: rules key their declines by member
class FoldNode:
    """One node whose value becomes a constant, and the nodes that will read the constant."""

    node: torch.fx.Node
    consumers: list                          # GEMMs, or the dequantize in front of one
    targets: list                            # the FoldTargets (operands) it serves
    cone: list                               # static call_function nodes, graph order
    decline: Optional[Decline] = None      # set by xnnfold.steps.fold.rules
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

    @property
    def to_fold(self) -> list:
        return [m for m in self.members if m.decline is None]


# --------------------------------------------------------------------------------------------
# Grouping


def fold_nodes(targets: Iterable[FoldTarget]) -> list:
    """One FoldNode per distinct node to fold (two GEMMs may read the same computed weight)."""
    by_node: dict = {}
    for target in targets:
        consumer = target.through_dequantize or target.gemm
        entry = by_node.get(target.node)
        if entry is None:
            entry = by_node[target.node] = FoldNode(target.node, [], [], target.cone)
        if consumer not in entry.consumers:
            entry.consumers.append(consumer)
        entry.targets.append(target)
    return list(by_node.values())


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
        touched = set(entry.cone)
        touched |= {i for n in entry.cone for i in n.all_input_nodes}
        for node in touched:
            if node in owner:
                parent[find(index)] = find(owner[node])
            else:
                owner[node] = index
    groups: dict = {}
    for index, entry in enumerate(nodes):
        groups.setdefault(find(index), Group()).members.append(entry)
    return list(groups.values())


# --------------------------------------------------------------------------------------------
# What folding a group would remove


def freed_nodes(group: Group) -> set:
    """The nodes (cone nodes and params) left with no user once ``group`` is folded.

    A folded node's consumers read the constant instead; every other user keeps the node (and
    so its inputs) alive. A part also used by a non-GEMM op therefore frees nothing.
    """
    rewired = {m.node: set(m.consumers) for m in group.members}
    candidates = {n for m in group.members for n in m.cone}
    candidates |= {s for n in candidates for s in n.all_input_nodes if s.op == "placeholder"}
    if not candidates:
        return set()
    dead: set = set()
    for node in reversed(next(iter(candidates)).graph.nodes):   # users before their inputs
        if node not in candidates:
            continue
        skip = rewired.get(node, set())
        if all(u in dead or u in skip or is_metadata_assertion(u) for u in node.users):
            dead.add(node)
    return dead
