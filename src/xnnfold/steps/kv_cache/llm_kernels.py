"""The cache update and the attention over it on executorch's LLM kernels (opt-in:
``XnnpackPartitioner(llm_kernels=True)``): ``llama::update_cache`` writes the step's rows into
the cache buffer in place, and ``llama::custom_sdpa`` attends rows ``0 .. P + l`` only, grouped
query heads natively. A .pte using them runs on runtimes built with executorch's LLM custom ops
(the wheel's pybindings, apps linking ``custom_ops``), not on XNNPACK + portable alone.

Both kernels keep the cache as ``[B, S, Hkv, D]`` (sequence before heads), executorch's custom
KV cache layout; transformers' and executorch's plain caches are ``[B, Hkv, S, D]``. The buffer
is the program's own state, read and written by nothing else (:mod:`.pattern` checks that), and
starts as zeros; it is re-laid out as ``[B, S, Hkv, D]`` (its transpose, so its contents are the
same rows) and every access to it goes through the two kernels.

Exact when the update writes rows ``P .. P + L - 1`` and the mask is causal from ``P`` for
every ``P`` the update accepts (:mod:`.positions`): ``custom_sdpa(is_causal=True, start_pos=P)``
attends exactly those rows. The rows it skips are the masked ones, whose softmax weight is
exactly 0 in eager.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

from ..attention.common import Emitter, val
from .pattern import CacheAttention, CacheUpdate

aten = torch.ops.aten
KERNELS = ("llama::update_cache", "llama::custom_sdpa")


def load_kernels() -> None:
    """Register the export-side definitions of executorch's LLM ops."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


def relayout(program, update: CacheUpdate, fake_mode) -> None:
    """Make ``update``'s buffer ``[B, S, Hkv, D]`` (its state tensor and placeholder)."""
    spec = next(s for s in program.graph_signature.input_specs if s.arg.name == update.buffer.name)
    state = program.state_dict if spec.persistent else program.constants
    state[spec.target] = state[spec.target].transpose(1, 2).contiguous()
    old = val(update.buffer)
    with fake_mode:
        update.buffer.meta["val"] = torch.empty(
            (old.shape[0], old.shape[2], old.shape[1], old.shape[3]), dtype=old.dtype)


def undo_relayout(program, update: CacheUpdate, fake_mode) -> None:
    """Put ``update``'s buffer back as :func:`relayout` found it."""
    spec = next(s for s in program.graph_signature.input_specs if s.arg.name == update.buffer.name)
    state = program.state_dict if spec.persistent else program.constants
    state[spec.target] = state[spec.target].transpose(1, 2).contiguous()
    with fake_mode:
        update.buffer.meta["val"] = torch.empty(update.shape, dtype=val(update.buffer).dtype)


def _item(emit: Emitter, start: torch.fx.Node) -> torch.fx.Node:
    """``start.item()``: an unbacked SymInt, bound in the node's meta (a fresh symbol left
    unbound in the program's ShapeEnv would break its next trace)."""
    node = emit(aten.item.default, start)
    shape_env = emit.fake_mode.shape_env
    if shape_env is not None:
        bindings = compute_unbacked_bindings(shape_env, node.meta["val"])
        if bindings:
            node.meta["unbacked_bindings"] = bindings
    return node


def _rows_blhd(emit: Emitter, update: CacheUpdate) -> torch.fx.Node:
    """The update's new rows as ``[B, L, Hkv, D]``."""
    b, hkv, _, d = update.shape
    rows = update.rows
    shape = list(val(rows).shape)
    if len(shape) != 4 or shape[0] != b or shape[1] != hkv:   # a broadcast value (index_put)
        rows = emit(aten.reshape.default, rows, [b, hkv, -1, d])
    return emit(aten.transpose.int, rows, 1, 2)


def _beside(emit: Emitter, anchor: torch.fx.Node) -> Emitter:
    """An emitter before ``anchor`` in ``emit``'s fake mode (an anchor without inputs, an
    ``arange``, has none of its own)."""
    other = Emitter(emit.graph, anchor)
    other.fake_mode = emit.fake_mode
    return other


def rewrite(emit: Emitter, attention: CacheAttention, start: torch.fx.Node,
            started: dict) -> None:
    """Replace the two updates and the SDPA by ``update_cache`` twice and ``custom_sdpa``.
    ``started``: {start node: its item() node}, shared by the layers (made right after the
    start node, before any update reads it)."""
    if start not in started:
        at_start = _beside(emit, start.next)
        started[start] = _item(at_start, start)
        emit.created += at_start.created
    position = started[start]
    for update in (attention.key, attention.value):
        at_update = _beside(emit, update.node)
        rows = _rows_blhd(at_update, update)
        at_update(torch.ops.llama.update_cache.default, rows, update.buffer, position)
        emit.created += at_update.created
    q = emit(aten.transpose.int, attention.query, 1, 2)                   # [B, L, H, D]
    out = emit(torch.ops.llama.custom_sdpa.default, q, attention.key.buffer,
               attention.value.buffer, position, None, 0.0, True, attention.scale)
    out = emit(aten.transpose.int, out, 1, 2)                               # [B, H, L, D]
    attention.sdpa.replace_all_uses_with(out)
    graph = emit.graph
    graph.erase_node(attention.sdpa)
    for node in attention.repeats:
        graph.erase_node(node)
    for update in (attention.key, attention.value):
        graph.erase_node(update.node)
