"""The positions a step writes and the mask it attends under, proven on the program itself.

- :func:`start_of` — the update's positions are ``arange(L) + P`` for one integer node ``P``
  (transformers: ``P`` is ``cache_position[0]`` kept in the cache's ``cumulative_length``), or a
  single position (``L == 1``): the rows written are ``P .. P + L - 1``.
- :func:`prove_mask` — evaluates the mask's computation, which must depend on ``P`` alone (and
  on constants), for *every* start ``P`` the update accepts (``0 .. S - L``: eager's
  ``index_copy_`` raises on any other) and compares it with the causal mask from ``P``: row
  ``l`` attends exactly the cache rows ``0 .. P + l``. That is a proof by exhaustion, not a
  pattern: it holds whatever ops build the mask, and fails for a padding or sliding-window mask.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ..attention.common import val

aten = torch.ops.aten
CAUSAL = "causal from the cache position"
_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)


def _arange_length(node) -> Optional[int]:
    """L if ``node`` is ``arange(L)`` (start 0, step 1)."""
    if node.op != "call_function" or node.target not in _ARANGES:
        return None
    args = list(node.args)
    if node.target is aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else 1
    if start == 0 and step == 1 and isinstance(end, int):
        return end
    return None


# Ops whose value is their first input's when dtype and shape are kept (a copy, a cast to the
# same dtype).
_SAME_VALUE = (aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default,
               aten.clone.default, aten.alias.default, aten.detach.default)


class ValueNumbers:
    """Which nodes of a graph hold the same value: a node is numbered as the first node of the
    same op on the same (numbered) arguments, and a same-dtype, same-shape cast or copy — and
    ``copy_(buffer, x)``, whose value is ``x`` — as its source. transformers copies
    ``cache_position[0]`` into each layer's ``cumulative_length`` buffer and reads it back with
    ``.to(int64)``: every layer has start nodes of its own, all one value."""

    def __init__(self, graph: torch.fx.Graph, written: set):
        self.number: dict = {}
        self._written = written    # placeholders written in place: a read of one is its own
        seen: dict = {}
        for node in graph.nodes:
            self.number[node] = self._number(node, seen)

    def _number(self, node, seen) -> torch.fx.Node:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return node
        source = None
        if node.target is aten.copy_.default and isinstance(node.args[1], torch.fx.Node):
            source = node.args[1]          # its value is what it copies, whatever it writes
        elif any(i in self._written for i in node.all_input_nodes):
            return node
        elif node.target in _SAME_VALUE and isinstance(node.args[0], torch.fx.Node):
            source = node.args[0]
        if source is not None:
            a, b = val(node), val(source)
            if a is not None and b is not None and a.dtype == b.dtype and \
                    tuple(a.shape) == tuple(b.shape):
                return self.number[source]
        if node.target._schema.is_mutable:
            return node
        try:
            key = (node.target, _key(node.args, self.number), _key(node.kwargs, self.number))
            hash(key)
        except TypeError:
            return node
        return seen.setdefault(key, node)

    def __call__(self, node: torch.fx.Node) -> torch.fx.Node:
        return self.number.get(node, node)


def _key(value, number):
    if isinstance(value, torch.fx.Node):
        return ("node", number[value])
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, number) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v, number)) for k, v in value.items()))
    return value


def start_of(positions: torch.fx.Node, numbers: ValueNumbers) -> Optional[torch.fx.Node]:
    """``P`` (its value number) if ``positions`` is ``arange(L) + P`` (``P`` a 0-D or
    one-element integer tensor), or ``positions`` itself if it holds one position; else None."""
    p = val(positions)
    if p is None:
        return None
    if positions.op == "call_function" and positions.target is aten.add.Tensor and \
            len(positions.args) == 2 and positions.kwargs.get("alpha", 1) == 1:
        for a, b in (positions.args, positions.args[::-1]):
            if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and \
                    _arange_length(a) == p.shape[0]:
                pv = val(b)
                if pv is not None and pv.numel() == 1 and not pv.dtype.is_floating_point:
                    return numbers(b)
    if isinstance(p.shape[0], int) and p.shape[0] == 1:
        return numbers(positions)
    return None


def same_positions(a: torch.fx.Node, b: torch.fx.Node, numbers: ValueNumbers) -> bool:
    """Whether two position tensors hold the same values: one value number, or
    ``arange(L) + P`` twice with the same ``L`` and ``P``."""
    if numbers(a) is numbers(b):
        return True
    pa, pb = start_of(a, numbers), start_of(b, numbers)
    return pa is not None and pa is pb and val(a).shape[0] == val(b).shape[0] and \
        val(a).shape[0] != 1


class MaskFunction:
    """The mask's computation as a function of ``P``: the nodes between them, run on real
    tensors (constants read from the program). Any node holding ``P``'s value
    (the same value number) takes it."""

    def __init__(self, mask: torch.fx.Node, start: torch.fx.Node, static_values: dict,
                 written: set, numbers: ValueNumbers):
        self.mask, self.start = mask, start
        self.nodes, self.values, self.reason = [], {}, None
        seen, todo = set(), [mask]
        self.holders = set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if numbers(node) is start:
                self.holders.add(node)
                continue
            if node.op == "placeholder":
                if node in written or node not in static_values:
                    self.reason = (f"the mask reads {node.name}, a user input or a buffer "
                                   f"written in place, other than through the start position")
                    return
                self.values[node] = static_values[node]
                continue
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                self.reason = f"the mask is computed by {node.name}, not an ATen op"
                return
            if node.target._schema.is_mutable:
                self.reason = f"the mask is computed by {node.name}, which writes in place"
                return
            todo += node.all_input_nodes
        self.nodes = [n for n in mask.graph.nodes if n in seen and n.op == "call_function"
                      and n not in self.holders]

    def __call__(self, start_value: torch.Tensor) -> torch.Tensor:
        env = dict(self.values)
        for holder in self.holders:
            env[holder] = start_value.reshape(val(holder).shape).to(val(holder).dtype)
        for node in self.nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            env[node] = node.target(*args, **kwargs)
        return env[self.mask]


def prove_mask(mask: torch.fx.Node, start: torch.fx.Node, rows: int, cache: int,
               static_values: dict, written: set, numbers: ValueNumbers) -> tuple:
    """(True, CAUSAL) if, for every start ``P`` in ``0 .. cache - rows``, the mask equals the
    causal mask from ``P`` (bool: True where attended; float: 0 there, -inf elsewhere) with
    all leading dims 1; else (False, why)."""
    if not isinstance(rows, int):
        return False, "the step's length is dynamic: the mask is proven for static lengths"
    function = MaskFunction(mask, start, static_values, written, numbers)
    if function.reason:
        return False, function.reason
    p = val(start)
    columns = torch.arange(cache)
    with torch.no_grad():
        for position in range(cache - rows + 1):
            got = function(torch.tensor(position, dtype=p.dtype))
            expected = columns[None, :] <= (position + torch.arange(rows))[:, None]
            if got.dim() > 2 and any(d != 1 for d in got.shape[:-2]):
                return False, f"the mask has leading dims {tuple(got.shape[:-2])}"
            got = got.reshape(got.shape[-2:]) if got.dim() >= 2 else got.reshape(1, -1)
            if got.dtype != torch.bool:
                expected = torch.where(expected, 0.0, float("-inf")).to(got.dtype)
            if tuple(got.shape) not in ((rows, cache), (1, cache)) or \
                    not torch.equal(got.expand(rows, cache), expected):
                return False, (f"at position {position} the mask is not the causal mask from "
                               "the cache position (padding, sliding window, or another mask)")
    return True, CAUSAL
