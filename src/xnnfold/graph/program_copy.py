"""Copies of a program for the pass to rewrite: the graph and signature new, the tensors shared
(nothing in the pass writes into a tensor), so a copy costs graph size, not model size. The
pass copies the caller's program once and rewrites the copy; the fold, the probe and the
partitioner copy what they hand on.
"""

from __future__ import annotations

import copy

from torch.export import ExportedProgram


def copy_with_nodes(ep: ExportedProgram) -> tuple:
    """A deep copy of ``ep`` whose graph and signature are new but whose tensors are shared, and
    the map from each node of ``ep`` to its copy (what was decided about a node of ``ep``
    applies to its copy: nothing is looked up by name)."""
    memo = {id(t): t for t in list(ep.state_dict.values()) + list(ep.constants.values())}
    copied = copy.deepcopy(ep, memo)
    # fx's graph copy records each node's copy in the memo, keyed by the node itself.
    nodes = {node: memo[node] for node in ep.graph.nodes if node.op != "output"}
    nodes[ep.graph.output_node()] = copied.graph.output_node()
    # fx renames a node named after a Python builtin when it copies a graph (``input`` becomes
    # ``input_1``, the argument name of nn.Linear's and nn.Conv's forward), but the signature
    # keeps the old name, and the copy no longer knows which placeholder is a user input. Give
    # the nodes back their names, as torch.export itself assigns them.
    renamed = False
    for original, node in nodes.items():
        if node.name != original.name:
            node.name = original.name
            renamed = True
    if renamed:
        copied.graph_module.recompile()
    return copied, nodes


def copy_program(ep: ExportedProgram) -> ExportedProgram:
    """:func:`copy_with_nodes` without the map."""
    return copy_with_nodes(ep)[0]
