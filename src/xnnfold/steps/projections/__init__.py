"""Packed projections: one linear whose output MHA cuts into parts, rewritten as one per part.

``nn.MultiheadAttention`` projects q/k/v (or k/v) with one linear over a packed weight, then
separates the parts of its output with a layout chain::

    y = linear(x, W, b)                    # (..., n*E)
    y.unflatten(-1, [n, E]).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()  # (n, ..., E)
    part_i = y[i]                          # select(0, i): (..., E)

In executorch 1.5.1 ``select_copy`` and ``squeeze_copy`` have no XNNPACK config, so the chain
stays on portable and cuts the attention into extra delegates, even in self-attention, where
stock delegates the linear itself. ``part_i`` is ``linear(x, W[i*E:(i+1)*E], b[i*E:(i+1)*E])``,
element for element, so each ``select`` is replaced by such a linear and the chain is dropped.
The row blocks are ``slice`` nodes of ``W`` and ``b``: computed weights like any other, which
the fold then turns into constants under the same rules. A rewrite whose part linears are not
all folded and delegated is undone (see :mod:`xnnfold.pipeline`), so the rewrite never leaves
more on portable than stock does. A PT2E-quantized projection (an int8 weight behind a
dequantize, the output's q/dq) is cut into int8 row blocks the same way: :mod:`.quantized`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from executorch.backends.transforms.utils import delete_constant_placeholder
from torch.export import ExportedProgram

from ...analysis import ProgramFacts, cone_of, is_dequantize
from ...decision import Decline
from ...errors import at_node
from ...graph.node_meta import tensor_val
from ...graph.validity import sync_output_specs
from ...analysis.gemms import operand
from . import quantized

aten = torch.ops.aten

_CONTIGUOUS_OPS = (aten.contiguous.default, aten.clone.default)


@dataclass
class PackedProjection:
    """A linear whose output only feeds MHA's layout chain, and the parts that chain selects."""

    linear: str                  # name of the packed linear
    parts: int                   # n
    width: int                   # E, the rows of each part
    chain: list                  # names of the layout nodes, in graph order
    selects: dict                # part index -> name of the select node that takes it
    part_linears: dict = field(default_factory=dict)   # part index -> new linear's name
    kept_because: Optional[Decline] = None   # rule split's Decline, when undone
    # PT2E int8: the weight cut by rows through its dequantize, and the output's q/dq nodes
    int8_weight: Optional[quantized.QuantizedWeight] = field(default=None, repr=False)
    output_qdq: Optional[tuple] = field(default=None, repr=False, compare=False)
    # the nodes named above, in the program the site was found in: linear, chain, selects
    found: tuple = field(default=(), repr=False, compare=False)

    @property
    def rewritten(self) -> bool:
        return self.kept_because is None

    def describe(self) -> str:
        if self.kept_because is not None:
            return (f"{self.linear}: packed projection of {self.parts} parts kept as is: "
                    f"{self.kept_because.reason}")
        taken = ", ".join(f"{self.part_linears.get(i, '?')} (rows {i * self.width}:"
                          f"{(i + 1) * self.width})" for i in sorted(self.selects))
        return f"{self.linear}: packed projection of {self.parts} parts split into {taken}"


def _only_user(node: torch.fx.Node, *targets) -> Optional[torch.fx.Node]:
    """The single user of ``node`` if it is a call to one of ``targets``."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op != "call_function" or user.target not in targets or user.args[0] is not node:
        return None
    return user


def _rank(node: torch.fx.Node) -> Optional[int]:
    val = tensor_val(node)
    return val.dim() if val is not None else None


def _dim_is(dim, wanted: int, rank: int) -> bool:
    return isinstance(dim, int) and -rank <= dim < rank and dim % rank == wanted


def _has_dequantize(node: torch.fx.Node, facts: ProgramFacts) -> bool:
    # A quantized weight would be folded as its fp32 value: never rewrite those.
    return any(is_dequantize(n) for n in cone_of(node, facts))


def _static_operand(node: Optional[torch.fx.Node], facts: ProgramFacts) -> bool:
    if node is None:
        return True
    if node not in facts.static or _has_dequantize(node, facts):
        return False
    val = tensor_val(node)
    return val is not None and val.is_floating_point()


def match(linear: torch.fx.Node, facts: ProgramFacts) -> Optional[PackedProjection]:
    """The packed projection rooted at ``linear``, or None if the chain is not MHA's exactly."""
    if linear.op != "call_function" or linear.target is not aten.linear.default:
        return None
    weight, bias = operand(linear, 1), operand(linear, 2)
    int8_weight = quantized.quantized_weight(weight, facts) if weight is not None else None
    if weight is None or not (int8_weight or _static_operand(weight, facts)) or \
            not _static_operand(bias, facts):
        return None
    rank = _rank(linear)
    # A statically quantized output: the chain starts after its q/dq, repeated per part.
    qdq = quantized.output_qdq(linear) if int8_weight is not None else None
    unflatten = _only_user(qdq[1] if qdq else linear, aten.unflatten.int)
    if rank is None or unflatten is None or len(unflatten.args) != 3:
        return None
    _, dim, sizes = unflatten.args
    out_features = linear.meta["val"].shape[-1]
    if not _dim_is(dim, rank - 1, rank) or not isinstance(out_features, int) or \
            len(sizes) != 2 or not all(isinstance(s, int) and s > 0 for s in sizes) or \
            sizes[0] * sizes[1] != out_features:
        return None
    parts, width = sizes
    # (..., n, E) -> (1, ..., n, E) -> (n, ..., 1, E) -> (n, ..., E): part i at index i.
    unsqueeze = _only_user(unflatten, aten.unsqueeze.default)
    if unsqueeze is None or not _dim_is(unsqueeze.args[1], 0, rank + 2):
        return None
    transpose = _only_user(unsqueeze, aten.transpose.int)
    if transpose is None or sorted(d % (rank + 2) for d in transpose.args[1:3]
                                   if isinstance(d, int)) != [0, rank]:
        return None
    squeeze = _only_user(transpose, aten.squeeze.dim)
    if squeeze is None or not _dim_is(squeeze.args[1], rank, rank + 2):
        return None
    layout = [unflatten, unsqueeze, transpose, squeeze]
    # .contiguous() is traced away where the squeezed tensor already is contiguous (1-D input)
    contiguous = _only_user(squeeze, *_CONTIGUOUS_OPS)
    if contiguous is not None:
        if contiguous.kwargs.get("memory_format",
                                 torch.contiguous_format) != torch.contiguous_format:
            return None
        layout.append(contiguous)
    last = layout[-1]
    selects = {}
    for user in last.users:
        if user.op != "call_function" or user.target is not aten.select.int or \
                user.args[0] is not last or not _dim_is(user.args[1], 0, rank + 1) or \
                not isinstance(user.args[2], int) or not -parts <= user.args[2] < parts:
            return None
        index = user.args[2] % parts
        if index in selects:   # the same part taken twice: keep the graph as it is
            return None
        selects[index] = user
    if not selects:
        return None
    layout = list(qdq or ()) + layout
    return PackedProjection(linear.name, parts, width, [n.name for n in layout],
                            {i: n.name for i, n in selects.items()},
                            found=(linear, layout, selects), int8_weight=int8_weight,
                            output_qdq=qdq)


def find_packed_projections(facts: ProgramFacts) -> list:
    return [site for node in facts.ep.graph.nodes
            if (site := match(node, facts)) is not None]


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


def found_in(result) -> list:
    """The packed projections a :class:`~xnnfold.result.FoldResult`'s fold step found, split
    or kept."""
    return [r for r in result.of("fold") if isinstance(r, PackedProjection)]


def split_in(result) -> list:
    """Those of :func:`found_in` that were split."""
    return [r for r in found_in(result) if r.rewritten]
