"""What the attention rewrites share: the record ``explain`` lists, the node emitter, and the
checks on what XNNPACK takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten
# Ops that only move or view data and that XNNPACK may take into the attention's delegate: a
# dequantize behind them would make XNNPACK see the attention's first ops as quantized ones.
# (``select`` and ``squeeze``, which XNNPACK does not take, end such a chain on portable.)
_LAYOUT = (aten.view.default, aten.reshape.default, aten.transpose.int, aten.permute.default,
           aten.contiguous.default, aten.unflatten.int, aten.unsqueeze.default,
           aten.expand.default, aten.clone.default)
MAX_RANK = 6      # XNNPACK's tensors have at most 6 dims (XNN_MAX_TENSOR_DIMS)
_COPIED_META = ("nn_module_stack", "stack_trace", "source_fn_stack")


@dataclass(frozen=True)
class AttentionRewrite:
    """One ``scaled_dot_product_attention`` (``op="attention"``) or batched ``matmul`` node:
    rewritten (``proven`` says why the rewrite is exact there) or kept as it was
    (``kept_because``)."""

    node: str
    proven: Optional[str] = None
    kept_because: Optional[str] = None
    op: str = "attention"

    @property
    def rewritten(self) -> bool:
        return self.kept_because is None

    def describe(self) -> str:
        what = "attention" if self.op == "attention" else "batched matmul"
        if self.rewritten:
            return (f"attention step: {what} {self.node} rewritten into ops XNNPACK takes "
                    f"({self.proven})")
        return f"attention step: {what} {self.node} kept as it was: {self.kept_because}"


def static_shape(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def reshape_arg(shape) -> Optional[list]:
    """``shape`` as a reshape argument XNNPACK takes: a dynamic dim written -1, or None if more
    than one dim is dynamic (XNNPACK's reshape infers at most one)."""
    dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    if len(dynamic) > 1:
        return None
    return [-1 if i in dynamic else d for i, d in enumerate(shape)]


def dequantized(node) -> bool:
    """True if ``node`` is, through layout ops only, the output of a dequantize."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if "dequantize" in str(node.target):
            return True
        if node.target not in _LAYOUT:
            return False
        node = node.args[0]
    return False


class Emitter:
    """Creates nodes before ``anchor`` with their fake values and the anchor's provenance."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node):
        self.graph, self.anchor = graph, anchor
        self.fake_mode = detect_fake_mode([n.meta.get("val") for n in anchor.all_input_nodes])
        self.created: list = []

    def discard(self) -> None:
        """Erase what was created (a rewrite that failed half-way), last first."""
        for node in reversed(self.created):
            self.graph.erase_node(node)
        self.created = []

    def __call__(self, target, *args, **kwargs) -> torch.fx.Node:
        with self.graph.inserting_before(self.anchor):
            name = f"{self.anchor.name}_{target.__name__.split('.')[0]}"
            node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        self.created.append(node)
        vals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*vals[0], **vals[1])
        for key in _COPIED_META:
            if key in self.anchor.meta:
                node.meta[key] = self.anchor.meta[key]
        return node


