"""Building nodes: the :class:`Emitter` (a node created with its fake value and its anchor's
provenance, erased again if the rewrite is given up), and the shapes XNNPACK takes in a
reshape."""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten
MAX_RANK = 6      # XNNPACK's tensors have at most 6 dims (XNN_MAX_TENSOR_DIMS)
_COPIED_META = ("nn_module_stack", "stack_trace", "source_fn_stack")


def static_shape(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def reshape_arg(shape) -> Optional[list]:
    """``shape`` as a reshape argument XNNPACK takes: a dynamic dim written -1, or None if more
    than one dim is dynamic (XNNPACK's reshape infers at most one)."""
    dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    if len(dynamic) > 1:
        return None
    return [-1 if i in dynamic else d for i, d in enumerate(shape)]


# Ops whose output holds its input's elements in the same row-major order (a view of the
# whole tensor): a reshape of their output is a reshape of their input.
_ORDER_KEEPING = (aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                  aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
                  aten.squeeze.dims, aten.flatten.using_ints)


def reshape_source(node: torch.fx.Node, shape) -> Optional[torch.fx.Node]:
    """The node ``node`` reshapes (through ops that keep the elements' order) whose shape is
    already ``shape``, if any: reshaping ``node`` to ``shape`` is that node itself. Inside an
    XNNPACK delegate each reshape is a copy (its static reshape), so a rewrite that reshapes a
    tensor back to the shape it came in with (the precomputed cross-attention keys of a
    decoder, sliced ``[H, S, D]`` from an input and unsqueezed to ``[1, H, S, D]`` for the
    model's attention) saves a copy of it per step."""
    if not static_shape(shape):
        return None
    current = node
    while True:
        val = current.meta.get("val")
        if current is not node and isinstance(val, torch.Tensor) and \
                static_shape(val.shape) and list(val.shape) == list(shape):
            return current
        if current.op != "call_function" or current.target not in _ORDER_KEEPING or \
                not isinstance(current.args[0], torch.fx.Node):
            return None
        current = current.args[0]


def item(emit: "Emitter", tensor: torch.fx.Node) -> torch.fx.Node:
    """``tensor.item()`` (one element): an unbacked SymInt, bound in the node's meta (a fresh
    symbol left unbound in the program's ShapeEnv would break its next trace)."""
    from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

    node = emit(aten.item.default, tensor)
    shape_env = emit.fake_mode.shape_env
    if shape_env is not None:
        bindings = compute_unbacked_bindings(shape_env, node.meta["val"])
        if bindings:
            node.meta["unbacked_bindings"] = bindings
    return node


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




def replace_each(graph: torch.fx.Graph, sites, left_because, write, record, what: str) -> list:
    """Replace each node of ``sites`` by what ``write(emit, node)`` builds before it (its last
    node), unless ``left_because(node)`` gives a reason; ``record(node_name, reason)`` (None when
    replaced) makes each site's record. A failure on one site discards what was built for it,
    warns once naming it (``what``, the node) and leaves it as stock has it."""
    import logging

    from ..errors import warn_or_raise

    records = []
    for node in list(sites):
        name, emit = node.name, None
        try:
            reason = left_because(node)
            if reason is None:
                emit = Emitter(graph, node)
                written = write(emit, node)
        except Exception as error:  # noqa: BLE001 - this site stays as stock has it
            if emit is not None:
                emit.discard()
            reason = (f"internal failure, left as stock leaves it: "
                      f"{type(error).__name__}: {error}")
            warn_or_raise(logging.getLogger("xnnfold"), "xnnfold: %s %r %s", what, name, reason)
        if reason is None:
            node.replace_all_uses_with(written)
            graph.erase_node(node)
        records.append(record(name, reason))
    return records
