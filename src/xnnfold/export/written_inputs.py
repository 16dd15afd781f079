"""A program that writes its inputs in place, lowered so that the write is in place.

transformers' exporter's ``decode`` (``export_for_generation``, static cache) takes the
``StaticCache`` as inputs, writes each layer's keys and values into them in place and returns
them. ``to_edge_transform_and_lower`` re-traces the program after the partitioner's transform
(executorch's decompositions): each re-trace of a program that writes a user input (torch's
unlifting, then functionalization) adds a ``copy(input, value)`` before the value is returned,
so the edge program writes every cache with ``index_put`` into a new tensor, copies that twice,
and ``to_executorch`` writes it back into the input with ``copy_``: four copies of every
layer's cache per step, on portable.

- :func:`drop_retrace_copies`, a transform pass (``to_edge_transform_and_lower`` runs it after
  the re-traces, before partitioning), replaces each ``copy(input, src)`` of a user input with
  ``src``'s shape, dtype and strides by ``src``: the same values.
- :func:`backend_config`: ``to_executorch`` with executorch's ``reinplace_pass`` (the
  ``index_put`` on the input, read by nothing after it once the copies are gone, becomes its
  in-place ``index_put_``: the step's rows only, and nothing written back), and
  :func:`read_written_inputs` after it: without it executorch 1.5.1's memory planner gives the
  written tensor's memory away while its in-place result is still read (measured: the cache
  returned differs from eager's everywhere, and at hidden 512 the logits are NaN).
"""

from __future__ import annotations

import dataclasses
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




def read_written_inputs(graph_module: torch.fx.GraphModule) -> Optional[PassResult]:
    """Each in-place ``index_put_``: what reads its result reads the tensor it wrote (the same
    tensor, after the write in the graph's order). A pass of ``to_executorch`` after
    ``reinplace_pass``: executorch 1.5.1's memory planner ends a tensor's lifetime at its last
    reader, and the result of an in-place op on it is not one; read through the result, the
    tensor's memory is given to later tensors while it is still read (measured: the decode's
    cache, an input, and the prefill's, made by the program, returned wrong)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    changed = False
    for node in graph_module.graph.nodes:
        if node.target is exir_ops.edge.aten.index_put_.default and node.users and \
                isinstance(node.args[0], torch.fx.Node):
            node.replace_all_uses_with(node.args[0])
            changed = True
    if changed:
        graph_module.recompile()
    return PassResult(graph_module, changed)


def backend_config(config=None):
    """``config`` (``to_executorch``'s, None for executorch's default) with executorch's
    ``reinplace_pass`` and :func:`read_written_inputs` after it."""
    from executorch.exir import ExecutorchBackendConfig

    base = config if config is not None else ExecutorchBackendConfig()
    return dataclasses.replace(base, run_reinplace_pass=True,
                               passes=[read_written_inputs] + list(base.passes))
