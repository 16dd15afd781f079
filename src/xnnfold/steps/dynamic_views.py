"""Views of a dynamic length written the way XNNPACK takes them: the one dynamic size as -1.

A program taking a dynamic length (a generation method's 1 to N tokens a call) reshapes its
activations with the length in the shape: ``view(x, [1, s, 4, 16])``, transformers'
``view(x, [1, s, -1, 16])``, and every ``reshape``, whose decomposition writes out the shape it
computes. XNNPACK's view config declines a shape with a symbolic size or with two sizes to
infer: each such view stays on portable, a delegate boundary at every projection's reshape and
every attention's output, in every layer (measured on a small Llama: 7 delegate calls a layer,
4 with the views taken). The output's shape is known: its static sizes as they are and its one
dynamic size as -1 (inferred from the element count, which is the input's) is the same view.
A ``reshape`` becomes a contiguous copy and a ``view`` (a view keeps its shape argument through
the decomposition; the copy is what a reshape of a strided tensor decomposes to anyway, and
XNNPACK takes it).

Only an fp32 view (what XNNPACK's view takes) whose output has exactly one dynamic size and no
static size 0 (beside which -1 is ambiguous), of an op's result that nothing writes in place
(a reshape is an alias, its copy is not); the node's name and value are kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from ..errors import warn_or_raise
from ..graph.emit import Emitter, reshape_arg
from ..graph.node_meta import tensor_val
from .protocol import Context, Outcome

logger = logging.getLogger("xnnfold")
aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


@dataclass(frozen=True)
class ViewsRewrite:
    """The program's views written with -1 (one record for all: a layer has several)."""

    views: tuple            # (node name, shape it had, shape it has)

    @property
    def rewritten(self) -> bool:
        return bool(self.views)

    def describe(self) -> str:
        name, was, now = self.views[0]
        more = f" and {len(self.views) - 1} more" if len(self.views) > 1 else ""
        return (f"dynamic_views step: {len(self.views)} views of a dynamic length written with "
                f"-1, which XNNPACK takes ({name}: {now}, not {was}{more})")


def _takes(shape) -> bool:
    """XNNPACK's view config takes this shape argument: ints, at most one -1."""
    return all(isinstance(d, int) for d in shape) and list(shape).count(-1) <= 1


def _aliased(node: torch.fx.Node) -> bool:
    """Whether a write in place could go through the view or to its source (a reshape of a
    contiguous tensor is an alias of it, a copy is not): the source is an input, or an op that
    mutates reads the source or the view."""
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function":
        return True
    readers = list(source.users) + list(node.users)
    return any(isinstance(r.target, torch._ops.OpOverload) and r.target._schema.is_mutable
               for r in readers)


def inferred_shape(node: torch.fx.Node) -> Optional[list]:
    """The view's shape with its one dynamic size as -1, where XNNPACK declines the one it has
    (or the decomposition would write it out); else None."""
    if node.op != "call_function" or node.target not in _VIEWS or len(node.args) < 2:
        return None
    shape, out = node.args[1], tensor_val(node)
    if out is None or not isinstance(shape, (list, tuple)):
        return None
    # fp32: what XNNPACK's view takes here (an int or bool view would only gain a copy)
    if out.dtype != torch.float32 or _aliased(node):
        return None
    # a view keeps its shape argument through the decomposition; a reshape's is recomputed
    if node.target is aten.view.default and _takes(shape):
        return None
    dynamic = [i for i, d in enumerate(out.shape) if not isinstance(d, int)]
    # -1 beside a static 0 is ambiguous (any size fits no elements)
    if len(dynamic) != 1 or any(isinstance(d, int) and d == 0 for d in out.shape):
        return None
    return reshape_arg(out.shape)


def _shown(shape) -> str:
    return "[" + ", ".join(d.name if isinstance(d, torch.fx.Node) else str(d)
                           for d in shape) + "]"


def rewrite_dynamic_views(program: ExportedProgram) -> list:
    """Rewrite, in place, the views of ``program`` (the pass's own copy) that XNNPACK declines
    for their dynamic size; one :class:`ViewsRewrite` for them all, or none."""
    views = []
    for node in list(program.graph.nodes):
        shape = inferred_shape(node)
        if shape is None:
            continue
        was = (node.target, node.args)
        emit = Emitter(program.graph, node)
        try:
            source = node.args[0]
            if node.target is not aten.view.default:
                # a reshape decomposes to a view (or a copy and a view) of the computed shape,
                # the -1 lost; a copy written out and a view keep it. The copy also makes the
                # view valid whatever the source's strides: the fake values of nodes after an
                # earlier step's rewrite keep the strides of the export (an SDPA's output was
                # [B, L, H, D] in memory; the rewritten attention's is [B, H, L, D]). Inside the
                # delegate it is one copy of the activation.
                source = emit(aten.clone.default, source, memory_format=torch.contiguous_format)
            node.target = aten.view.default
            node.args = (source, shape)
        except Exception as error:  # noqa: BLE001 - this view stays as it was
            node.target, node.args = was
            emit.discard()
            warn_or_raise(logger, "xnnfold: dynamic_views: %s left as it was: %s: %s",
                          node.name, type(error).__name__, error)
            continue
        views.append((node.name, _shown(was[1][1]), _shown(shape)))
    # (the sym_size nodes only those views read go with the pipeline's tidying)
    return [ViewsRewrite(tuple(views))] if views else []


class DynamicViewsStep:
    name = "dynamic_views"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_dynamic_views(program))


STEP = DynamicViewsStep()
