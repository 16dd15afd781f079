"""A packed projection split: one linear per part the layout chain selects, each reading its
rows of the packed weight and bias (an int8 weight through its dequantize, cut by rows), the
packed param dropped when nothing else reads it. :func:`split_packed_projections` works on
the fold's copy of the program."""

from __future__ import annotations

import torch
import torch.fx
from executorch.backends.transforms.utils import delete_constant_placeholder
from torch.export import ExportedProgram

from ...analysis.gemms import operand
from ...errors import at_node
from ...graph.validity import sync_output_specs
from . import quantized
from .record import PackedProjection

aten = torch.ops.aten


def _row_block(graph: torch.fx.Graph, source: torch.fx.Node, start: int, stop: int,
               name: str) -> torch.fx.Node:
    block = graph.create_node("call_function", aten.slice.Tensor, (source, 0, start, stop),
                              name=name)
    block.meta["val"] = aten.slice.Tensor(source.meta["val"], 0, start, stop)
    return block


def split_packed_projections(program: ExportedProgram, sites: list, nodes: dict) -> None:
    """Rewrite each site in ``program`` in place: one linear per selected part.

    ``program`` must be the caller's own copy of the program the sites were found in, and
    ``nodes`` the map from that program's nodes to ``program``'s
    (``program_copy.copy_with_nodes``). Records each new linear's name in its site.
    """
    graph = program.graph
    for site in sites:
        linear, chain, selects = site.found
        linear, chain = nodes[linear], [nodes[n] for n in chain]
        selects = {index: nodes[n] for index, n in selects.items()}
        with at_node(linear, "splitting the packed projection"):
            _split(program, site, linear, chain, selects, nodes)
    graph.lint()
    program.graph_module.recompile()
    sync_output_specs(program)     # a part the model returns is a new linear now


def _split(program: ExportedProgram, site: PackedProjection, linear: torch.fx.Node,
           chain: list, selects: dict, nodes: dict) -> None:
    graph = program.graph
    x, weight, bias = operand(linear, 0), operand(linear, 1), operand(linear, 2)
    int8_weight = site.int8_weight
    if int8_weight is not None:
        int8_weight = quantized.QuantizedWeight(nodes[int8_weight.dequantize],
                                                int8_weight.per_channel)
    qdq = tuple(nodes[n] for n in site.output_qdq) if site.output_qdq else None
    for index, select in sorted(selects.items()):
        start, stop = index * site.width, (index + 1) * site.width
        with graph.inserting_before(select):
            stem = f"{site.linear}_part{index}"
            if int8_weight is not None:
                w_part = int8_weight.part(program, graph, start, stop, f"{stem}_weight")
                x_part = quantized.part_input(graph, x, stem)
            else:
                w_part, x_part = _row_block(graph, weight, start, stop, f"{stem}_weight"), x
            b_part = _row_block(graph, bias, start, stop, f"{stem}_bias") \
                if bias is not None else None
            part = graph.create_node("call_function", aten.linear.default,
                                     (x_part, w_part, b_part), name=stem)
            part.meta = {**linear.meta, "val": aten.linear.default(
                x.meta["val"], w_part.meta["val"],
                b_part.meta["val"] if b_part is not None else None)}
            result = quantized.part_output(graph, part, qdq, stem) if qdq else part
        select.replace_all_uses_with(result)
        graph.erase_node(select)
        site.part_linears[index] = part.name
    for node in reversed([linear] + chain):
        graph.erase_node(node)
    if int8_weight is not None:
        _drop_packed(program, x, int8_weight.dequantize)


def _drop_packed(program: ExportedProgram, x: torch.fx.Node, dequantize: torch.fx.Node) -> None:
    """Erase what only the packed int8 linear read: its input's dequantize (copied per part),
    its weight's dequantize, and that one's scales and zero points (each part holds its rows
    of them). The packed int8 tensor itself is the fold's to free, as any folded param."""
    params = dequantize.args[1:3]      # read before erasing: erase_node clears the args
    for node in (x, dequantize):
        if node.op == "call_function" and not node.users:
            program.graph.erase_node(node)
    for param in params:
        if isinstance(param, torch.fx.Node) and param.op == "placeholder" and not param.users:
            delete_constant_placeholder(program, param)
