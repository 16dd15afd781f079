"""The cache buffer re-shaped, its bytes untouched: ``[B, Hkv, S, D]`` read as
``[B * Hkv, S, D]`` (the default) or ``[B * Hkv, S, 1, D]`` (``llama::update_cache``).

XNNPACK's ``bmm`` takes 3-D operands, and a reshape inside a delegate is a copy (XNNPACK's
static reshape): reading the cache ``[B, Hkv, S, D]`` through one costs a copy of the whole
cache per layer and step (measured: 0.045 ms each for K and V of a 2,048-row cache, beside
0.06 ms for the product itself). The buffer is the program's own state, read and written by
the update alone (:mod:`.pattern` checks that): given the 3-D shape, the attention reads it as
it is and the update writes the same rows.
"""

from __future__ import annotations

import torch
import torch.fx

from ...graph.emit import Emitter
from ...graph.node_meta import tensor_val
from .pattern import CacheUpdate

aten = torch.ops.aten


def _state(program, update: CacheUpdate) -> tuple:
    spec = next(s for s in program.graph_signature.input_specs if s.arg.name == update.buffer.name)
    return (program.state_dict if spec.persistent else program.constants), spec.target


def reshape_buffer(program, update: CacheUpdate, shape: tuple, fake_mode) -> None:
    """Give ``update``'s buffer ``shape`` (its state tensor and placeholder's fake value)."""
    state, key = _state(program, update)
    # a tensor of its own, not a view of the caller's: a view's base, already fakified by
    # a lowering of the caller's program, is remembered by its FakeTensorMode with other
    # metadata, and fakifying the view then fails (requires_grad False != True)
    state[key] = state[key].reshape(shape).clone()
    with fake_mode:
        update.buffer.meta["val"] = torch.empty(shape, dtype=tensor_val(update.buffer).dtype)


def restore_buffer(program, update: CacheUpdate, fake_mode) -> None:
    """Put ``update``'s buffer back as exported."""
    reshape_buffer(program, update, update.shape, fake_mode)


def flat_shape(update: CacheUpdate) -> tuple:
    b, hkv, s, d = update.shape
    return b * hkv, s, d


def relaid_shape(update: CacheUpdate, extra_dim: bool) -> tuple:
    """The shape a rewrite gives ``update``'s buffer: ``[B * Hkv, S, D]`` (``extra_dim``, for
    ``llama::update_cache``: ``[B * Hkv, S, 1, D]``)."""
    b, hkv, s, d = update.shape
    return (b * hkv, s, 1, d) if extra_dim else (b * hkv, s, d)


def beside(emit: Emitter, anchor: torch.fx.Node) -> Emitter:
    """An emitter before ``anchor`` in ``emit``'s fake mode (an anchor without inputs, an
    ``arange``, has none of its own), recording what it creates in ``emit``."""
    other = Emitter(emit.graph, anchor)
    other.fake_mode, other.created = emit.fake_mode, emit.created
    return other


def rows_flat(emit: Emitter, update: CacheUpdate, extra_dim: bool = False) -> torch.fx.Node:
    """The update's new rows ``[B, Hkv, L, D]`` as ``[B * Hkv, L, D]`` (``extra_dim``:
    ``[B * Hkv, L, 1, D]``)."""
    b, hkv, _, d = update.shape
    rows = emit(aten.reshape.default, update.rows, [b, hkv, -1, d])
    if extra_dim:
        return emit(aten.reshape.default, emit(aten.unsqueeze.default, rows, 3),
                    [b * hkv, -1, 1, d])
    return emit(aten.reshape.default, rows, [b * hkv, -1, d])


def update_flat(outer: Emitter, update: CacheUpdate) -> torch.fx.Node:
    """The update of the (re-shaped) ``[B * Hkv, S, D]`` buffer, beside the old one: the same
    in-place op at the same positions, on dim 1; returns it (the updated cache, for the
    attention). What it creates is recorded in ``outer``."""
    emit = beside(outer, update.node)
    rows = rows_flat(emit, update)
    if update.node.target is aten.index_copy_.default:
        node = emit(aten.index_copy_.default, update.buffer, 1, update.positions, rows)
    else:
        node = emit(aten.index_put_.default, update.buffer, [None, update.positions], rows)
    return node
