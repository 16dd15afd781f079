"""Ops the ExecuTorch runtime will refuse or misread for the dim orders of their tensors,
found at lowering time rather than on the device.

The emitter declares each tensor's dim order from the strides of its fake value
(``exir.tensor.dim_order_from_stride``), so what the runtime will see is already in the Edge
program. Two things there are known to go wrong in executorch 1.5.1:

- ``nonzero``: torch's fake ``nonzero`` has eager's column-major strides ``(1, n)``, so its
  output is declared in dim order ``(1, 0)``, while the portable kernel writes its rows
  contiguously. A portable op reading it fails the run (``slice_copy``, ``select_copy``,
  ``add``: ``Failed to execute method forward, error: 0x12``), and returned as an output it is
  read transposed: wrong values, no error. (:mod:`xnnfold.steps.mask_index` removes the
  ``nonzero`` of ``x[torch.where(mask)]``; this check names what is left.)
- a portable kernel that checks that its tensors share one dim order
  (``tensors_have_same_dim_order``: all contiguous or all channels-last) given tensors that
  do not: a channels-last value read by ``cumsum``, ``_softmax``, ``slice_copy``... whose fake
  output is contiguous. The run fails with error 0x12, or, for some kernels, gives wrong values.

Not every kernel checks: ``mean``, ``sum``, ``var``, ``prod``, ``expand_copy``,
``convolution`` (and ``view_copy`` in one program of two) ran right with mixed dim orders on
this wheel's runtime. So the second rule is asked only of the kernels found to fail or misread
that way (a table made by running one small program per op on the runtime: ``_CHECKED``); an op
it does not list is not reported. Sound, and not complete.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.tensor import dim_order_from_stride

from .errors import warn_or_raise
from .graph.node_meta import tensor_val

logger = logging.getLogger("xnnfold")

# Kernels that write their output contiguously whatever dim order it is declared in.
_WRITE_CONTIGUOUS = frozenset({exir_ops.edge.aten.nonzero.default})
_edge = exir_ops.edge.aten
# Portable kernels of executorch 1.5.1 found to fail the run (error 0x12) or to give wrong
# values when their tensors do not share one dim order: one program per op, its input made
# channels-last, run on this wheel's runtime (tests/test_dim_order.py runs a few of them).
_CHECKED = frozenset({
    _edge.cumsum.default, _edge.permute_copy.default, _edge._softmax.default,
    _edge._log_softmax.default, _edge.amax.default, _edge.argmax.default,
    _edge.native_layer_norm.default, _edge.index_select.default, _edge.gather.default,
    _edge.slice_copy.Tensor, _edge.select_copy.int, _edge.split_with_sizes_copy.default,
    _edge.squeeze_copy.dims, _edge.unsqueeze_copy.default, _edge.repeat.default,
    _edge.where.self, _edge.index.Tensor, _edge.add.Tensor, _edge.any.dim, _edge.topk.default,
})


@dataclass(frozen=True)
class DimOrderConflict:
    """A node outside delegates whose tensors the runtime takes in different dim orders."""

    node: str
    op: str
    orders: tuple            # (what, dim order) of each tensor: "self", "other", "out"...
    misread: bool = False    # a kernel that writes contiguously, its output declared otherwise

    def describe(self) -> str:
        orders = ", ".join(f"{what} {order}" for what, order in self.orders)
        if self.misread:
            return (f"{self.node} ({self.op}): its output is declared in dim order "
                    f"{self.orders[-1][1]} but the portable kernel writes it contiguously: a "
                    f"portable op reading it fails the run (error 0x12) or misreads it, and "
                    f"returned as an output it is read transposed")
        return (f"{self.node} ({self.op}) takes tensors in different dim orders ({orders}): "
                f"its portable kernel fails the run (error 0x12) or gives wrong values")


def _order(value) -> Optional[tuple]:
    """The dim order the emitter declares for ``value`` (None: 0-D and 1-D have one)."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    stride = value.stride()
    if all(isinstance(s, int) for s in stride):
        # dim_order_from_stride's own order (a stable sort, largest stride first) without its
        # symbolic comparisons, which cost ~0.5 ms a tensor
        return tuple(sorted(range(len(stride)), key=lambda d: stride[d], reverse=True))
    return tuple(int(d) for d in dim_order_from_stride(stride))


def _kind(order: tuple) -> str:
    rank = len(order)
    if order == tuple(range(rank)):
        return "contiguous"
    if order == (0, *range(2, rank), 1):
        return "channels-last"
    return "other"


def _tensors(node: torch.fx.Node) -> list:
    """(what, dim order) of the node's tensor arguments (not those inside lists) and outputs."""
    found = []
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    for index, arg in enumerate(node.args):
        if isinstance(arg, torch.fx.Node):
            found.append((names[index] if index < len(names) else f"arg{index}",
                          _order(tensor_val(arg))))
    for name, arg in node.kwargs.items():
        if isinstance(arg, torch.fx.Node):
            found.append((name, _order(tensor_val(arg))))
    value = node.meta.get("val")
    outputs = value if isinstance(value, (list, tuple)) else [value]
    for index, out in enumerate(outputs):
        found.append(("out" if len(outputs) == 1 else f"out{index}", _order(out)))
    return [(what, order) for what, order in found if order is not None]


def conflict_of(node: torch.fx.Node) -> Optional[DimOrderConflict]:
    """The dim-order conflict of one Edge node run on portable kernels, or None."""
    if node.op != "call_function" or node.target not in _WRITE_CONTIGUOUS | _CHECKED:
        return None
    name = str(node.target._schema).split("(")[0]
    if node.target in _WRITE_CONTIGUOUS:
        out = _order(tensor_val(node))
        if out is not None and _kind(out) != "contiguous":
            return DimOrderConflict(node.name, name, (("out", out),), misread=True)
        return None
    tensors = _tensors(node)
    kinds = {_kind(order) for _, order in tensors}
    if len(tensors) < 2 or kinds in ({"contiguous"}, {"channels-last"}):
        return None
    return DimOrderConflict(node.name, name, tuple(tensors))


def dim_order_conflicts(graph: torch.fx.Graph,
                        delegated: Callable[[torch.fx.Node], bool]) -> list:
    """The :class:`DimOrderConflict` of each node of an Edge ``graph`` left outside delegates
    (``delegated(node)`` False)."""
    return [c for node in graph.nodes
            if node.op == "call_function" and not delegated(node) and
            (c := conflict_of(node)) is not None]


def warn_of_conflicts(result) -> list:
    """Warn, naming each node, of the ops left outside delegates that the runtime will refuse
    for the dim orders of their tensors (this module's): the .pte lowers, as stock's
    does, and fails on the device. Returns the :class:`~xnnfold.dim_order.DimOrderConflict`s."""
    try:
        conflicts = dim_order_conflicts(result.tagged_exported_program.graph,
                                        lambda node: node.meta.get("delegation_tag") is not None)
    except Exception as error:  # noqa: BLE001 - a check: the lowering is stock's either way
        warn_or_raise(logger, "xnnfold: could not check the dim orders of the ops outside "
                      "delegates (%s: %s)", type(error).__name__, error)
        return []
    if conflicts:
        logger.warning("xnnfold: the ExecuTorch runtime will refuse %d op(s) of this program "
                       "for the dim orders of their tensors (stock's lowering too):\n  %s",
                       len(conflicts), "\n  ".join(c.describe() for c in conflicts))
    return conflicts
