"""The positions a step writes and the mask it attends under, proven on the program itself.

- :func:`start_of` — the update's positions are ``arange(L) + P`` for one integer node ``P``
  (transformers: ``P`` is ``cache_position[0]`` kept in the cache's ``cumulative_length``), or a
  single position (``L == 1``): the rows written are ``P .. P + L - 1``. ``L`` may be a dynamic
  length (a prefill method taking 1 to N tokens): then the same symbol as the step's.
- :class:`MaskFunction` — the mask's computation as a function of ``P`` (and ``L``), which
  :mod:`.mask_proof` evaluates for every start and length to say what the mask is.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ...graph.node_meta import tensor_val
from ...graph.values import ValueNumbers, same_size

aten = torch.ops.aten
_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)


def _arange_length(node):
    """L if ``node`` is ``arange(L)`` (start 0, step 1): an int, or the SymInt of a dynamic
    length (``end`` a node holding it)."""
    if node.op != "call_function" or node.target not in _ARANGES:
        return None
    args = list(node.args)
    if node.target is aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else 1
    if isinstance(end, torch.fx.Node) and isinstance(end.meta.get("val"), torch.SymInt):
        end = end.meta["val"]
    if start == 0 and step == 1 and isinstance(end, (int, torch.SymInt)):
        return end
    return None


def length_bounds(length, cache: int) -> Optional[range]:
    """The lengths a step of ``length`` rows may have (1 .. at most ``cache``): ``[length]``,
    or the range a dynamic length's ShapeEnv allows; None if it has no finite bounds."""
    if isinstance(length, int):
        return range(length, length + 1)
    node = length.node
    bounds = node.shape_env.bound_sympy(node.expr)
    try:
        low, high = int(bounds.lower), int(bounds.upper)
    except (TypeError, ValueError, OverflowError):    # unbounded (int_oo) or not a number
        return None
    return range(max(low, 1), min(high, cache) + 1)


def start_of(positions: torch.fx.Node, numbers: ValueNumbers) -> Optional[torch.fx.Node]:
    """``P`` (its value number) if ``positions`` is ``arange(L) + P`` (``P`` a 0-D or
    one-element integer tensor), or ``positions`` itself if it holds one position; else None."""
    p = tensor_val(positions)
    if p is None:
        return None
    if positions.op == "call_function" and positions.target is aten.add.Tensor and \
            len(positions.args) == 2 and positions.kwargs.get("alpha", 1) == 1:
        for a, b in (positions.args, positions.args[::-1]):
            if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and \
                    same_size(_arange_length(a), p.shape[0]):
                pv = tensor_val(b)
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
    length = tensor_val(a).shape[0]
    return pa is not None and pa is pb and same_size(length, tensor_val(b).shape[0]) and \
        not (isinstance(length, int) and length == 1)


class MaskFunction:
    """The mask's computation as a function of ``P`` (and of the step's length ``L``, if
    dynamic): the nodes between them, run on real tensors (constants read from the program).
    Any node holding ``P``'s value (the same value number) takes it; any node holding the
    length's symbol takes ``L``."""

    def __init__(self, mask: torch.fx.Node, start: torch.fx.Node, static_values: dict,
                 written: set, numbers: ValueNumbers, length=None):
        self.mask, self.start = mask, start
        self.nodes, self.values, self.reason = [], {}, None
        seen, todo = set(), [mask]
        self.holders, self.lengths = set(), set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if numbers(node) is start:
                self.holders.add(node)
                continue
            if isinstance(length, torch.SymInt) and same_size(node.meta.get("val"), length):
                self.lengths.add(node)
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
                      and n not in self.holders and n not in self.lengths]

    def __call__(self, start_value: torch.Tensor, length: Optional[int] = None) -> torch.Tensor:
        env = dict(self.values)
        for holder in self.holders:
            env[holder] = start_value.reshape(tensor_val(holder).shape).to(tensor_val(holder).dtype)
        for holder in self.lengths:
            env[holder] = length
        for node in self.nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            env[node] = node.target(*args, **kwargs)
        return env[self.mask]

    def batched(self, starts: torch.Tensor, length: Optional[int]) -> torch.Tensor:
        """The mask for each start of ``starts`` ([N] -> [N, *mask]): one vmapped run, or one
        run per start where an op cannot be batched."""
        try:
            return torch.vmap(lambda p: self(p, length))(starts)
        except Exception:  # noqa: BLE001 - an op without a batching rule: one at a time
            return torch.stack([self(p, length) for p in starts])
