"""A program that writes its inputs in place, lowered without the copies re-tracing adds.

transformers' exporter's ``decode`` (``export_for_generation``, static cache) takes the
``StaticCache`` as inputs, writes each layer's keys and values into them in place and returns
them. ``to_edge_transform_and_lower`` re-traces the program after the partitioner's transform
(executorch's decompositions): each re-trace of a program that writes a user input (torch's
unlifting, then functionalization) adds a ``copy(input, value)`` before the value is returned,
so the edge program writes every cache with ``index_put`` into a new tensor, copies that twice,
and ``to_executorch`` writes it back into the input with ``copy_``: four copies of every
layer's cache per step, on portable.

:func:`drop_retrace_copies`, a transform pass (``to_edge_transform_and_lower`` runs it after
the re-traces, before partitioning), replaces each ``copy(input, src)`` of a user input with
``src``'s shape, dtype and strides by ``src``: the same values. Two copies are left, the
``index_put`` and the write-back.

The write in place (executorch's ``reinplace_pass``: the ``index_put`` on the input becomes its
in-place ``index_put_``, and ``to_executorch`` writes nothing back) would leave none, but
executorch 1.5.1 does not run such a program right with its inputs in the arena (the default):
measured on a one-layer program with an input cache and its position counter, the cache the
.pte returns differs from eager's everywhere, and at transformers' decode (hidden 512) the
logits are NaN. With the inputs the caller's (``alloc_graph_input=False``) the one-layer program
runs right through executorch's pybindings, but transformers' decode exported with
``ExecutorchConfig(alloc_graph_input=False)`` gives wrong logits through transformers' runner
with or without it. It is not turned on.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.fx.passes.infra.pass_base import PassResult


def _same_layout(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


def retrace_copies(graph: torch.fx.Graph) -> list:
    """The ``copy(input, src)`` nodes whose value is ``src``'s: ``input`` a placeholder with
    ``src``'s shape, dtype and strides."""
    from executorch.exir.dialects._ops import ops as exir_ops

    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not exir_ops.edge.aten.copy.default:
            continue
        target, source = node.args[0], node.args[1]
        if isinstance(target, torch.fx.Node) and target.op == "placeholder" and \
                isinstance(source, torch.fx.Node) and \
                _same_layout(target.meta.get("val"), source.meta.get("val")):
            found.append(node)
    return found


def drop_retrace_copies(graph_module: torch.fx.GraphModule) -> Optional[PassResult]:
    """Each copy :func:`retrace_copies` finds replaced by its source (a pass of
    ``to_edge_transform_and_lower``'s ``transform_passes``)."""
    copies = retrace_copies(graph_module.graph)
    for node in copies:
        node.replace_all_uses_with(node.args[1])
        graph_module.graph.erase_node(node)
    if copies:
        graph_module.recompile()
    return PassResult(graph_module, bool(copies))


