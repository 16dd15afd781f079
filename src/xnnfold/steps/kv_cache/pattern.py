"""What the KV-cache step recognises in an exported program (before decomposition: the training
IR, where a cache update is an in-place op on the buffer).

- a **cache update**: ``index_copy_(cache, 2, positions, rows)`` (transformers' ``StaticLayer``)
  or ``index_put_(cache, [None, None, positions], rows)`` (executorch's example ``KVCache``) on
  a buffer ``cache`` of shape ``[B, Hkv, S, D]``, or on a program input of that shape the
  program writes (transformers' exporter's ``decode``: the ``StaticCache`` passed in, written
  and returned; its shape is the caller's, :mod:`.decide` keeps it);
- an **attention over the cache**: ``scaled_dot_product_attention(q, k, v, mask)`` whose ``k``
  and ``v`` are two updated caches, each repeated for grouped-query attention by transformers'
  ``repeat_kv`` (``unsqueeze`` + ``expand`` + ``reshape``), by ``repeat_interleave`` (executorch's
  example), by nothing (one query head per KV head) or by SDPA itself (``enable_gqa=True``).

A match is a :class:`CacheAttention`, or :class:`Declined` where an attention reads a cache in a
way the step does not take. What the program proves of it (the positions, the mask) is decided
by :mod:`.decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ...graph.node_meta import tensor_val
from ...graph.sdpa import scale_of, sdpa_args
from ...graph.values import written_placeholders
from . import pairing

aten = torch.ops.aten
_UPDATES = (aten.index_copy_.default, aten.index_put_.default)
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


@dataclass
class CacheUpdate:
    """One in-place update of a cache buffer ``[B, Hkv, S, D]`` at ``positions`` (dim 2)."""

    node: torch.fx.Node          # the index_copy_ / index_put_
    buffer: torch.fx.Node        # the buffer's placeholder
    target: str                  # the buffer's name in the program's state, or the input's
    positions: torch.fx.Node     # int64 [L]
    rows: torch.fx.Node          # the new rows (broadcastable to [B, Hkv, L, D])
    shape: tuple = ()            # the buffer's [B, Hkv, S, D], as exported
    is_input: bool = False       # a program input the program writes, not a buffer


@dataclass(frozen=True)
class Declined:
    """An attention over a cache the step leaves as it was, and why."""

    reason: str


@dataclass
class CacheAttention:
    """One SDPA over two updated caches."""

    sdpa: torch.fx.Node
    query: torch.fx.Node         # [B, H, L, D]
    key: CacheUpdate
    value: CacheUpdate
    groups: int                  # query heads per KV head
    mask: Optional[torch.fx.Node]
    scale: float
    repeats: list = field(default_factory=list)   # nodes repeating k and v (erased after)
    # an eager attention (:mod:`.eager`): the ops on the scores between the two products, in
    # eager's order, ``sdpa`` the product with V it replaces; None for an SDPA
    scores: Optional[tuple] = None
    between: tuple = ()      # its nodes from the weights back to the key's transpose, users first

    @property
    def value_dim(self) -> int:
        """The value's head size (the output's), which may differ from the key's."""
        return self.value.shape[3]


def buffer_targets(program: ExportedProgram) -> dict:
    """{placeholder name: state key} of the program's buffers."""
    return {s.arg.name: s.target for s in program.graph_signature.input_specs
            if s.kind == InputKind.BUFFER}


def user_inputs(program: ExportedProgram) -> set:
    """The names of the program's user inputs' placeholders."""
    return {s.arg.name for s in program.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT}


def find_updates(program: ExportedProgram) -> tuple:
    """({update node: CacheUpdate}, {cache name: why not a cache}) over the buffers and the
    user inputs written in place."""
    buffers, inputs = buffer_targets(program), user_inputs(program)
    updates, refused = {}, {}
    for placeholder, writers in written_placeholders(program).items():
        if placeholder.name in inputs:
            update = _as_update(placeholder, writers, placeholder.name)
            if isinstance(update, CacheUpdate):
                update.is_input = True
        elif placeholder.name in buffers:
            update = _as_update(placeholder, writers, buffers[placeholder.name])
        else:
            continue
        if isinstance(update, str):
            refused[placeholder.name] = update
        elif update is not None:
            updates[update.node] = update
    return updates, refused


def _as_update(buffer: torch.fx.Node, writers: list, target: str):
    """A CacheUpdate, None (not a cache-like write at all) or why it is not one."""
    node = writers[0]
    if node.target not in _UPDATES:
        return None
    cache = tensor_val(buffer)
    if cache is None or cache.dim() != 4:
        return (f"{node.name}: a {cache.dim() if cache is not None else '?'}-D buffer, not "
                "[B, Hkv, S, D]")
    if len(writers) > 1:
        return f"{buffer.name} is written {len(writers)} times"
    others = [u for u in buffer.users if u is not node]
    if others:
        return f"{buffer.name} is also read by {others[0].name}, not through its update"
    if node.target is aten.index_copy_.default:
        _, dim, positions, rows = node.args[:4]
        if dim % 4 != 2:
            return f"{node.name} updates dim {dim}, not the sequence dim 2"
    else:
        _, indices, rows = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate or len(indices) != 3 or indices[0] is not None or indices[1] is not None \
                or not isinstance(indices[2], torch.fx.Node):
            return f"{node.name} is not cache[:, :, positions] = rows"
        positions = indices[2]
    p = tensor_val(positions)
    if p is None or p.dim() != 1 or p.dtype not in (torch.int64, torch.int32):
        return f"{node.name}: positions are not a 1-D integer tensor"
    b, hkv, _, d = cache.shape
    if _unpadded(tensor_val(rows).shape) != _unpadded([b, hkv, p.shape[0], d]):
        return (f"{node.name}: rows {tuple(tensor_val(rows).shape)} broadcast to "
                f"[{b}, {hkv}, L, {d}]")
    return CacheUpdate(node, buffer, target, positions, rows, tuple(cache.shape))


def _unpadded(shape) -> list:
    """``shape`` without its leading 1s (the dims a broadcast may add)."""
    shape = list(shape)
    while shape and isinstance(shape[0], int) and shape[0] == 1:
        shape.pop(0)
    return shape


def _through_reshape(node):
    return node.args[0] if node.op == "call_function" and node.target in RESHAPES else None


def ungroup(node: torch.fx.Node, heads: int) -> Optional[tuple]:
    """(the tensor ``node`` repeats per group, groups, the repeating nodes) if ``node`` is a
    ``[B, Hkv, S, D]`` tensor repeated to ``heads`` heads (GQA), or itself with groups 1."""
    out = tensor_val(node)
    if out is None or out.dim() != 4:
        return None
    if node.op == "call_function" and node.target is aten.repeat_interleave.self_int:
        source, repeats = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        if dim is not None and dim % 4 == 1 and isinstance(repeats, int):
            return source, repeats, [node]
        return None
    inner = _through_reshape(node)
    chain = [node]
    if inner is not None and inner.op == "call_function" and \
            inner.target in (aten.clone.default, aten.contiguous.default):
        chain.append(inner)
        inner = inner.args[0]
    if inner is not None and inner.op == "call_function" and inner.target is aten.expand.default:
        unsqueezed = inner.args[0]
        if unsqueezed.op == "call_function" and unsqueezed.target is aten.unsqueeze.default \
                and unsqueezed.args[1] % 5 == 2:
            source = unsqueezed.args[0]
            b, hkv, s, d = tensor_val(source).shape
            groups = tensor_val(inner).shape[2]
            if list(tensor_val(inner).shape) == [b, hkv, groups, s, d] and \
                    list(out.shape) == [b, hkv * groups, s, d]:
                return source, groups, chain + [inner, unsqueezed]
        return None
    return node, 1, []


def match_attention(node: torch.fx.Node, updates: dict
                    ) -> Union[CacheAttention, Declined, None]:
    """A CacheAttention if ``node`` (an SDPA) reads two updated caches; Declined if it does but
    the step cannot take it; None if it does not read a cache at all."""
    a = sdpa_args(node)
    q, k, v = (tensor_val(a[n]) for n in ("query", "key", "value"))
    if q is None or k is None or v is None:
        return None
    heads = q.shape[1] if q.dim() == 4 else None
    found = []
    for name in ("key", "value"):
        if a["enable_gqa"]:
            given = tensor_val(a[name])
            source, groups, chain = a[name], (heads // given.shape[1]
                                              if heads and given.dim() == 4 else 0), []
        else:
            ungrouped = ungroup(a[name], heads) if heads is not None else None
            if ungrouped is None:
                return None if not reads_update(a[name], updates) else Declined(
                    f"its {name} is read from a cache in a way the step does not recognise")
            source, groups, chain = ungrouped
        if source not in updates:
            return None if not reads_update(a[name], updates) else Declined(
                f"its {name} is read from a cache through ops the step does not recognise")
        found.append((updates[source], groups, chain))
    (key, gk, kchain), (value, gv, vchain) = found
    reason = pairing.why_not_sdpa(a, q, key, value, gk, gv)
    if reason:
        return Declined(reason)
    return CacheAttention(node, a["query"], key, value, gk, a["attn_mask"],
                          scale_of(a, q.shape[-1]),
                          kchain + vchain)


def reads_update(node: torch.fx.Node, updates: dict, depth: int = 6) -> bool:
    """Whether ``node`` is computed from an updated cache within a few ops."""
    todo, seen = [(node, 0)], set()
    while todo:
        current, level = todo.pop()
        if current in updates:
            return True
        if current in seen or level >= depth or current.op != "call_function":
            continue
        seen.add(current)
        todo += [(i, level + 1) for i in current.all_input_nodes]
    return False
