"""Memory planning for programs with ``torch.cond``: each branch's outputs placed where the
parent planned the cond's outputs.

executorch 1.5.1's emitter binds a cond's output value to its branch's output tensor with a
``MoveCall`` (the value is moved, its data not copied), and its memory planning puts every
branch's tensors, its outputs included, in one region from offset 0 that the branches of all
the conds share. A cond's output thus lives in memory the next cond's branch writes: read after
that cond ran, it holds the other branch's values. Two conds whose outputs are added after both
ran give wrong sums (measured: off by 2 to 10 on values of about 1); XNNPACK's partitioner makes
that the rule, fusing the adds of all the conds' outputs into one delegate after the last cond.

:class:`CondOutputsInParent` is a memory-planning algorithm (``MemoryPlanningPass(
memory_planning_algo=...)``, the pass's documented hook) that wraps executorch's: once a graph
is planned, each branch's output tensors take the offsets planned for the cond's outputs, whose
lifetime runs from the cond to their last reader. A program without conds is planned exactly as
before.
"""

from __future__ import annotations

from torch.utils import _pytree as pytree


def _cond_nodes(graph_module):
    import torch

    return [n for n in graph_module.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.higher_order.cond]


def _outputs(branch) -> list:
    output = branch.graph.output_node()
    return [arg.meta.get("spec") for arg in pytree.tree_leaves(output.args[0])]


class CondOutputsInParent:
    """executorch's memory planning (``inner``, by default its greedy suite), then every cond's
    branch outputs moved onto the cond's own planned outputs."""

    __name__ = "cond_outputs_in_parent"

    def __init__(self, inner=None):
        from executorch.exir.memory_planning import MemoryPlanningAlgorithmSuite

        self.inner = inner if inner is not None else MemoryPlanningAlgorithmSuite()

    def __call__(self, alignment, specs, graph_module, graph_signature, extra_padding):
        sizes = self.inner(alignment, specs, graph_module, graph_signature, extra_padding)
        for cond in _cond_nodes(graph_module):
            planned = pytree.tree_leaves(cond.meta.get("spec"))
            for branch_node in cond.args[1:3]:
                branch = getattr(graph_module, branch_node.target)
                outputs = _outputs(branch)
                if len(outputs) != len(planned):
                    raise RuntimeError(f"{cond.name}: {len(outputs)} branch outputs, "
                                       f"{len(planned)} planned")
                for inner, outer in zip(outputs, planned):
                    if inner is None or outer is None or outer.mem_offset is None:
                        raise RuntimeError(f"{cond.name}: an output without a planned place")
                    if inner.allocated_memory > outer.allocated_memory:
                        raise RuntimeError(f"{cond.name}: a branch output larger than the "
                                           "cond's")
                    inner.mem_id, inner.mem_offset = outer.mem_id, outer.mem_offset
        return sizes
