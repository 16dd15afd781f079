"""Partitions XNNPACK's preprocess accepts: no delegate that returns a value twice or its input.

The XNNPACK partitioner takes no-op copies into a delegate: an identity ``clone`` (a
``.clone()``, an eval-mode ``nn.Dropout``: ``_clone_dim_order`` in Edge) and a
``_to_dim_order_copy`` that changes no dtype. ``XnnpackBackend.preprocess`` then removes them
with its own passes (``XNNPACKRemoveCloneOpsTransform``; ``RemoveRedundantCopyPass``, which
drops a copy into the memory format its input already has and a pair of copies that undo each
other). When a value and its copy both leave the delegate, the delegate returns the same node
twice; when the copies only round-trip a delegate input, it returns that input. Either way
``generate_node_to_external_map`` raises ("Output node ... is already in the inputs") and the
whole lowering fails — stock's too.

:func:`untag_vanishing_copies` predicts, per partition, what each output becomes once those
copies are gone, and untags the copies that would make an output repeat another one or be an
input: they run on portable, where a copy is cheap and correct. It only ever untags a node
whose inputs all come from outside the partition, or whose users are all outside it, so no
partition gets a path out and back in: a copy that is also read inside its partition splits off
what reads it into a partition of its own. A partition whose fix would leave it an input in a
non-default dim order (which preprocess also rejects) keeps its tags as they were.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx
from executorch.exir.dialects._ops import ops as exir_ops

from .graph.node_meta import tensor_val

logger = logging.getLogger("xnnfold")

TAG = "delegation_tag"
CLONES = frozenset({exir_ops.edge.aten.clone.default,
                    exir_ops.edge.dim_order_ops._clone_dim_order.default})
LAYOUT_COPIES = frozenset({exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
                           exir_ops.edge.aten._to_copy.default})
# Ops the XNNPACK delegate runs channels-last (ChannelsLastTaggedReshapePass's own set): a copy
# into channels-last right after one of them is a copy into the format the value already has.
_NHWC_OPS = frozenset({exir_ops.edge.aten.convolution.default,
                       exir_ops.edge.aten.upsample_bilinear2d.vec,
                       exir_ops.edge.aten.mean.dim, exir_ops.edge.aten.max_pool2d.default,
                       exir_ops.edge.aten.amax.default, exir_ops.edge.aten.max.dim,
                       exir_ops.edge.aten.avg_pool2d.default, exir_ops.edge.aten.prelu.default})


def _channels_last(val: Optional[torch.Tensor]) -> bool:
    """As XNNPACK's pass reads a tensor: channels-last and not also contiguous."""
    if val is None or val.dim() != 4:
        return False
    return val.is_contiguous(memory_format=torch.channels_last) and not val.is_contiguous()


def _default_dim_order(val: Optional[torch.Tensor]) -> bool:
    return val is None or tuple(val.dim_order()) == tuple(range(val.dim()))


class _Partition:
    """One tag's call_function nodes, and what each becomes once preprocess drops its copies."""

    def __init__(self, graph: torch.fx.Graph, tag: str):
        self.tag = tag
        self.nodes = [n for n in graph.nodes if n.op == "call_function" and
                      n.meta.get(TAG) == tag]

    def inside(self, node) -> bool:
        return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
            node.meta.get(TAG) == self.tag

    def outputs(self) -> list:
        return [n for n in self.nodes if any(not self.inside(u) for u in n.users)]

    def sources(self) -> dict:
        """node -> (what it is after preprocess's copy removal, the copies dropped on the way,
        in graph order). A node that stays is its own source."""
        source: dict = {}
        nhwc: dict = {}

        def read(arg):   # what a node reads once the copies before it are gone
            return source[arg] if arg in source else (arg, [])

        for node in self.nodes:
            arg = node.args[0] if node.args else None
            if not isinstance(arg, torch.fx.Node):
                source[node], nhwc[node] = (node, []), node.target in _NHWC_OPS
                continue
            base, dropped = read(arg)
            base_nhwc = nhwc[base] if base in nhwc else _channels_last(tensor_val(base))
            if node.target in CLONES and _same_layout(node, arg):
                # XNNPACKRemoveCloneOpsTransform keeps a clone from a delegate input to an output
                kept = not self.inside(base) and any(not self.inside(u) for u in node.users)
                if not kept:
                    source[node], nhwc[node] = (base, dropped + [node]), base_nhwc
                    continue
            elif node.target in LAYOUT_COPIES and _same_dtype(node, arg):
                mine = _channels_last(tensor_val(node))
                if mine == base_nhwc:   # into the format its input already has
                    source[node], nhwc[node] = (base, dropped + [node]), mine
                    continue
                if self.inside(base) and base.target in LAYOUT_COPIES and \
                        len(base.users) == 1 and base.args and _same_dtype(base, base.args[0]):
                    # a pair of copies that undo each other: both go
                    first, before = read(base.args[0])
                    source[node], nhwc[node] = (first, before + [base] + dropped + [node]), mine
                    continue
            source[node] = (node, [])
            nhwc[node] = node.target in _NHWC_OPS or (
                _channels_last(tensor_val(node)) if node.target in LAYOUT_COPIES else
                bool(node.all_input_nodes) and all(
                    nhwc.get(a, _channels_last(tensor_val(a))) for a in node.all_input_nodes))
        return source

    def next_untag(self, moved: frozenset) -> Optional[torch.fx.Node]:
        """A copy to untag so that no output repeats another or is an input, or None.
        ``moved``: the nodes already untagged by this fix. Raises ``_CannotFix`` when the only
        such node cannot leave without a cycle."""
        sources = self.sources()
        owner: dict = {}   # source -> the output kept in the delegate for it
        outputs = self.outputs()
        for out in outputs:   # an output that stays is its own source: it keeps its place
            if sources[out][0] is out:
                owner[out] = out
        for out in outputs:
            base, dropped = sources[out]
            if not dropped:
                continue
            if not self.inside(base):
                return dropped[0]        # reads from outside the partition: always safe
            if owner.setdefault(base, out) is out:
                continue
            return out                   # the caller splits off what reads it inside
        # A copy this fix untagged that leaves an input in another layout. Only those: a
        # partition stock made already reads such inputs as it likes (a linear after a
        # channels-last copy, which preprocess takes), and is not this fix's to change.
        for node in self.nodes:
            for arg in node.all_input_nodes:
                if arg in moved and not self.inside(arg) and \
                        not _default_dim_order(tensor_val(arg)):
                    if all(not self.inside(a) for a in node.all_input_nodes) or \
                            all(not self.inside(u) for u in node.users):
                        return node
                    raise _CannotFix(node)
        return None


class _CannotFix(Exception):
    pass


def _same_layout(node, arg) -> bool:
    a, b = tensor_val(node), tensor_val(arg)
    return a is None or b is None or tuple(a.dim_order()) == tuple(b.dim_order())


def _same_dtype(node, arg) -> bool:
    a, b = tensor_val(node), tensor_val(arg)
    return a is not None and b is not None and a.dtype == b.dtype


def untag_vanishing_copies(graph: torch.fx.Graph, partition_tags: dict) -> list:
    """Untag, in place, the copies of each partition that preprocess would remove into a
    delegate returning a node twice or returning its input; a copy also read inside its
    partition splits off what reads it (a new tag in ``partition_tags``); tags left with no node
    are dropped. Returns the untagged nodes."""
    untagged = []
    for tag in list(partition_tags):
        before, tags_before = {n: n.meta.get(TAG) for n in graph.nodes}, dict(partition_tags)
        mine: list = []
        try:
            pending = [tag]
            while pending:
                current = pending.pop()
                while (node := _Partition(graph, current).next_untag(
                        frozenset(untagged + mine))) is not None:
                    del node.meta[TAG]
                    mine.append(node)
                    split = _split_after(graph, node, current, partition_tags)
                    if split is not None:
                        pending.append(split)
        except _CannotFix as stuck:
            _restore(graph, before)
            partition_tags.clear()
            partition_tags.update(tags_before)
            logger.warning("xnnfold: partition %s would read %s in a non-default dim order, "
                           "which XNNPACK rejects, once the copies it drops are outside; left as "
                           "stock partitions it", tag, stuck.args[0].name)
            continue
        untagged += mine
    _drop_empty(graph, partition_tags)
    return untagged


def _drop_empty(graph: torch.fx.Graph, partition_tags: dict) -> None:
    """Drop the tags no call_function has any more, with their constants: a delegate with no
    node would return its inputs."""
    used = {n.meta.get(TAG) for n in graph.nodes if n.op == "call_function"}
    for tag in [t for t in partition_tags if t not in used]:
        del partition_tags[tag]
        for node in graph.nodes:
            if node.op == "placeholder" and node.meta.get(TAG) == tag:
                del node.meta[TAG]


def _split_after(graph: torch.fx.Graph, copy: torch.fx.Node, tag: str,
                 partition_tags: dict) -> Optional[str]:
    """``copy``, just untagged, is also read inside partition ``tag``: give what depends on it
    there a partition of its own (a new tag), or the partition would have a path out and back
    in. What does not depend on it keeps ``tag``; no path leads from the new partition back to
    it (all of the new one descends from ``copy``). Returns the new tag, or None."""
    below, todo = set(), [u for u in copy.users if u.meta.get(TAG) == tag]
    while todo:
        node = todo.pop()
        if node not in below and node.op == "call_function" and node.meta.get(TAG) == tag:
            below.add(node)
            todo += list(node.users)
    if not below:
        return None
    new = next(f"{tag}_{i}" for i in range(1, len(partition_tags) + 2)
               if f"{tag}_{i}" not in partition_tags)
    partition_tags[new] = partition_tags[tag]
    for node in below:
        node.meta[TAG] = new
    for node in graph.nodes:   # a constant read by the new partition only moves with it
        if node.op == "placeholder" and node.meta.get(TAG) == tag and node.users and \
                all(u.meta.get(TAG) == new for u in node.users):
            node.meta[TAG] = new
    return new


def _restore(graph: torch.fx.Graph, tags: dict) -> None:
    for node in graph.nodes:
        if tags.get(node) is None:
            node.meta.pop(TAG, None)
        else:
            node.meta[TAG] = tags[node]
