"""What a step changed in a program: its fingerprint before and after, compared.

The pipeline takes a :class:`Fingerprint` of the program before and after each step: a step
whose program differs and whose records say no rewrite broke the step protocol
(:mod:`xnnfold.pipeline`). What is compared is what lowering reads: the nodes in order (name,
op, target, args, kwargs, the marks steps leave in ``meta["custom"]`` for the partitioner's
configs), the signature's input and output specs, the state and constant tensors by key, and
the range constraints' symbols.

Cheap on a large graph: fx keeps a node's args and kwargs in immutable containers that it
replaces, never mutates, when a step rewires the node, so the fingerprint holds references and
the comparison finds the same objects wherever the step did not touch a node; only a node of a
new program (a step that returned a copy) is compared by the names its arguments read. A state
tensor is the same object, or one of the same dtype, shape and values (a buffer re-shaped and
restored by a rewrite given up is a new tensor, not a change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram


@dataclass(frozen=True)
class Fingerprint:
    nodes: tuple        # (node, name, op, target, args, kwargs, custom marks) in graph order
    specs: tuple        # (kind, arg, target, persistent) of each input spec, then each output
    tensors: dict       # state_dict and constants: key -> tensor
    ranges: frozenset   # the range constraints' symbols
    dead: frozenset     # the names of the call_function nodes nothing read

    @classmethod
    def of(cls, program: ExportedProgram) -> "Fingerprint":
        nodes, dead = [], set()
        for node in program.graph.nodes:
            custom = node.meta.get("custom")
            nodes.append((node, node.name, node.op, node.target, node.args, node.kwargs,
                          dict(custom) if custom else None))
            if node.op == "call_function" and not node.users:
                dead.add(node.name)
        signature = program.graph_signature
        specs = tuple((s.kind, s.arg, s.target, getattr(s, "persistent", None))
                      for s in (*signature.input_specs, *signature.output_specs))
        return cls(tuple(nodes), specs, {**program.state_dict, **program.constants},
                   frozenset(program.range_constraints), frozenset(dead))


def _named(value):
    return torch.fx.node.map_arg(value, lambda n: n.name)


def _same_args(a, b) -> bool:
    if a is b:
        return True
    try:
        if a == b:          # the same nodes (fx nodes compare by identity)
            return True
        return _named(a) == _named(b)       # a node of a copy reads the same names
    except Exception:  # noqa: BLE001 - an argument that does not compare: told by its text
        return repr(_named(a)) == repr(_named(b))


def _same_tensor(a, b) -> bool:
    if a is b:
        return True
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    try:
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    except Exception:  # noqa: BLE001 - a tensor that cannot be compared (fake): changed
        return False


def first_change(before: Fingerprint, after: Fingerprint) -> Optional[tuple]:
    """``(where, what)`` of the first difference between two fingerprints, or None."""
    for old, new in zip(before.nodes, after.nodes):
        if old[0] is new[0] and old[4] is new[4] and old[5] is new[5] and \
                old[1:4] == new[1:4] and old[6] == new[6]:
            continue        # the node untouched: the same containers, marks equal
        name = old[1]
        if old[1] != new[1]:
            return name, f"node {name} replaced by {new[1]} or renamed"
        if old[2:4] != new[2:4]:
            return name, f"node {name} now calls {new[3]}"
        if not (_same_args(old[4], new[4]) and _same_args(old[5], new[5])):
            return name, f"the arguments of node {name}"
        if old[6] != new[6]:
            return name, f"the marks of node {name} (meta['custom'])"
    if len(before.nodes) != len(after.nodes):
        longer = before.nodes if len(before.nodes) > len(after.nodes) else after.nodes
        name = longer[min(len(before.nodes), len(after.nodes))][1]
        return name, f"node {name} {'removed' if longer is before.nodes else 'added'}"
    for old, new in zip(before.specs, after.specs):
        if old != new:
            return "<signature>", f"the signature's spec of {old[2] or old[1]}"
    if len(before.specs) != len(after.specs):
        return "<signature>", "the signature's number of inputs and outputs"
    keys = before.tensors.keys() | after.tensors.keys()
    for key in sorted(keys):
        if not _same_tensor(before.tensors.get(key), after.tensors.get(key)):
            return "<state>", f"the state tensor {key}"
    if before.ranges != after.ranges:
        return "<program>", "the range constraints"
    return None
