"""Attention over a KV cache written out op by op (transformers' ``eager_attention_forward``,
BLOOM's ``baddbmm``, MPT's and Falcon's own code): from a ``softmax`` of the last dim, back
through the ops on the scores to the product of the query with the key cache, and on to the
product of the weights with the value cache:

- the product: ``matmul(q, K^T)`` (``q [B, H, L, D]``), ``bmm(q3, K3^T)`` or
  ``baddbmm(bias, q3, K3^T, beta=1, alpha)`` (``q3`` and ``K3`` the ``[B * H, ., D]`` views of
  ``q`` and ``K``, the scores viewed ``[B, H, L, S]`` after it), ``K`` an updated cache repeated
  for grouped-query attention (:func:`.pattern.ungroup`) or not;
- the ops on the scores (:class:`Op`), in eager's order: ``mul`` / ``div`` / ``add`` of a
  number or of a tensor that broadcasts to ``[B, H, L, S]`` (a mask, an ALiBi bias, per head or
  shared), ``tanh`` (Gemma2's soft-capping ``tanh(s / cap) * cap``), ``masked_fill(bool mask,
  number)``; same-dtype casts and copies change nothing;
- after the softmax: same-dtype casts, a ``dropout`` that drops nothing (``p=0`` or eval), a view
  to ``[B * H, L, S]``; then ``matmul(w, V)`` or ``bmm(w3, V3)``.

Every node between the two products has that one user (attention weights a model also returns
are not the step's to change). :func:`.grouped.rewrite` computes the same ops in the same order
on the grouped scores (:mod:`.scores`), then eager's plain softmax: the mask is not changed.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.fx

from ...graph.node_meta import tensor_val
from . import scores as grouped_scores
from .scores import Op
from .pairing import why_not_cache_pair
from .pattern import RESHAPES, CacheAttention, Declined, reads_update, ungroup
from ...graph.values import same_shape

aten = torch.ops.aten
SOFTMAXES = (aten.softmax.int, aten._softmax.default)
_PRODUCTS = (aten.matmul.default, aten.bmm.default, aten.baddbmm.default)
_BINARY = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.add.Tensor,
           aten.add.Scalar)
# Ops whose value is their first input's when they keep its dtype and shape
_SAME = (aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.clone.default,
         aten.contiguous.default, aten.alias.default, aten.detach.default, aten.type_as.default)
_ASSERT = aten._assert_tensor_metadata.default   # what a ``.to()`` leaves: a check, no value


def _users(node: torch.fx.Node) -> list:
    return [u for u in node.users if u.target is not _ASSERT]


def _with_asserts(nodes) -> tuple:
    """``nodes`` (users first), each after the metadata checks made on it (erased before it)."""
    return tuple(x for node in nodes for x in
                 [u for u in node.users if u.target is _ASSERT] + [node])


def _keeps_value(node: torch.fx.Node) -> bool:
    """A same-dtype, same-shape cast or copy, or a dropout that drops nothing."""
    if node.op != "call_function":
        return False
    if node.target is aten.dropout.default:
        p, train = (list(node.args[1:]) + [0.0, True])[:2]
        return p == 0.0 or train is False
    a, b = tensor_val(node), tensor_val(node.args[0]) if node.args else None
    return node.target in _SAME and a is not None and b is not None and a.dtype == b.dtype \
        and same_shape(a.shape, b.shape)


def _number(value) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _view_of(node: torch.fx.Node, shape) -> Optional[torch.fx.Node]:
    """``x`` if ``node`` is a reshape of ``x`` to ``shape``."""
    if node.op != "call_function" or node.target not in RESHAPES:
        return None
    return node.args[0] if same_shape(tensor_val(node).shape, shape) else None


def _transposed(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """``x`` if ``node`` swaps the last two dims of ``x`` (3-D or 4-D)."""
    if node.op != "call_function" or tensor_val(node.args[0]) is None:
        return None
    rank = tensor_val(node.args[0]).dim()
    if node.target is aten.transpose.int:
        swapped = sorted(d % rank for d in node.args[1:3]) == [rank - 2, rank - 1]
    elif node.target is aten.permute.default:
        swapped = [d % rank for d in node.args[1]] == list(range(rank - 2)) + [rank - 1, rank - 2]
    else:
        swapped = False
    return node.args[0] if swapped else None


def _from_product(x, depth: int = 12) -> bool:
    """Whether ``x`` is computed from a product through first operands (the scores, not a mask
    or a bias beside them)."""
    while isinstance(x, torch.fx.Node) and x.op == "call_function" and depth:
        if x.target in _PRODUCTS:
            return True
        x, depth = x.args[0], depth - 1
    return False


def _scores_ops(node: torch.fx.Node) -> Union[str, tuple]:
    """(the product, the ops on its scores in eager's order, the view after it or None, the
    nodes between) walking back from the softmax's input, or why not."""
    ops, nodes, view = [], [], None
    while True:
        if node.op != "call_function" or len(_users(node)) != 1:
            return f"the scores {node.name} are read by {len(_users(node))} nodes"
        if node.target in _PRODUCTS:
            return node, ops[::-1], view, nodes
        nodes.append(node)
        if _keeps_value(node):
            node = node.args[0]
        elif node.target in RESHAPES and view is None:
            view, node = node, node.args[0]
        elif node.target is aten.tanh.default:
            ops.append(Op(node.target))
            node = node.args[0]
        elif node.target is aten.masked_fill.Scalar and _number(node.args[2]) is not None \
                and isinstance(node.args[1], torch.fx.Node):
            ops.append(Op(node.target, node.args[1], _number(node.args[2])))
            node = node.args[0]
        elif node.target in _BINARY and node.kwargs.get("alpha", 1) == 1 and \
                len(node.args) == 2:
            a, b = node.args
            if node.target in (aten.mul.Tensor, aten.add.Tensor) and _from_product(b):
                a, b = b, a
            other = b if isinstance(b, torch.fx.Node) else _number(b)
            if not isinstance(a, torch.fx.Node) or other is None or other is a or \
                    _from_product(other):
                return f"{node.name}: not the scores and a number or another tensor"
            ops.append(Op(node.target, other))
            node = a
        else:
            return f"the scores pass through {node.name} ({node.target})"


def _weights_user(softmax: torch.fx.Node) -> Union[str, tuple]:
    """(the product of the weights with V, the nodes between) or why not."""
    node, nodes = softmax, []
    while True:
        users = _users(node)
        if len(users) != 1:
            return f"the attention weights {node.name} are read by {len(users)} nodes"
        user = users[0]
        if user.op == "call_function" and user.target in _PRODUCTS[:2] and \
                user.args[0] is node:
            return user, nodes
        if not (_keeps_value(user) or (user.op == "call_function" and user.target in RESHAPES)):
            return f"the attention weights go through {user.name} ({user.target})"
        nodes.append(user)
        node = user


def match_eager(softmax: torch.fx.Node, updates: dict
                ) -> Union[CacheAttention, Declined, None]:
    """A CacheAttention (``scores``: the ops between the products) if ``softmax`` is that of an
    eager attention over two updated caches; Declined if it reads a cache in a way the step
    does not take; None if it is not an attention over a cache."""
    x = softmax.args[0]
    xv = tensor_val(x)
    if xv is None or xv.dim() not in (3, 4) or softmax.args[1] % xv.dim() != xv.dim() - 1:
        return None
    found = _scores_ops(x)
    if isinstance(found, str):     # a few ops on the scores, a product, a repeat: 12 at most
        return Declined(found) if reads_update(x, updates, depth=12) else None
    product = found[0]
    after = _weights_user(softmax)
    pair = after if isinstance(after, str) else _pair(softmax, *found, *after, updates)
    # past the product, an attention reads a cache if either of its operands does
    if not isinstance(pair, str):
        return pair
    return Declined(pair) if any(reads_update(a, updates, depth=8)
                                 for a in product.all_input_nodes) else None


def _cache_of(node, heads: int, updates: dict, three: bool):
    """(the update, groups, the repeating nodes) if ``node`` is an updated cache ``[B, Hkv, S,
    D]`` (repeated to ``heads`` heads or not) or, ``three``, its ``[B * H, S, D]`` view."""
    chain = []
    if three:                       # [B * H, S, D] viewed from [B, H, S, D]
        inner = node.args[0] if node.op == "call_function" and node.args else None
        iv = tensor_val(inner) if isinstance(inner, torch.fx.Node) else None
        if iv is None or iv.dim() != 4 or iv.shape[1] != heads or _view_of(
                node, (iv.shape[0] * heads, *iv.shape[2:])) is None:
            return None
        chain, node = [node], inner
    found = ungroup(node, heads)
    if found is None or found[0] not in updates:
        return None
    return updates[found[0]], found[1], chain + found[2]


def _pair(softmax, product, ops, view, nodes, out, after_nodes, updates):
    """The CacheAttention of an eager attention's two products, or why not."""
    three = product.target is not aten.matmul.default
    left, right = product.args[1:3] if product.target is aten.baddbmm.default \
        else product.args[:2]
    query = left.args[0] if three and left.op == "call_function" and left.args else left
    q = tensor_val(query) if isinstance(query, torch.fx.Node) else None
    if q is None or q.dim() != 4 or (three and _view_of(left, (
            q.shape[0] * q.shape[1], *q.shape[2:])) is None):
        return f"the query of {product.name} is not [B, H, L, D] (or its [B * H, L, D] view)"
    pv = tensor_val(product)
    batch, heads = q.shape[0], q.shape[1]
    if three and view is not None and not same_shape(
            tensor_val(view).shape, (batch, heads, *pv.shape[1:])):
        return f"{view.name} views the scores as {tuple(tensor_val(view).shape)}"
    keys = _transposed(right)
    key = _cache_of(keys, heads, updates, three) if keys is not None else None
    value = _cache_of(out.args[1], heads, updates, out.target is aten.bmm.default)
    if key is None or value is None or len(_users(right)) != 1:
        return "its key or value is read from a cache through ops the step does not recognise"
    (key, gk, kchain), (value, gv, vchain) = key, value
    if product.target is aten.baddbmm.default:
        ops = _bias_ops(product, batch, heads) + ops
        if isinstance(ops[0], str):
            return ops[0]
    if three and view is None and any(isinstance(op.other, torch.fx.Node) for op in ops):
        return "a tensor added to the [B * H, L, S] scores"
    reason = why_not_cache_pair(q, key, value, gk, gv, (query,)) or \
        grouped_scores.why_not_operands(ops, q, key.shape[2])
    if reason:
        return reason
    between = _with_asserts(list(after_nodes[::-1]) + [softmax] + nodes + [product, right])
    return CacheAttention(out, query, key, value, gk, None, 1.0, kchain + vchain,
                          scores=tuple(ops), between=between)


def _bias_ops(product: torch.fx.Node, batch: int, heads: int) -> list:
    """``baddbmm(bias, ., ., beta=1, alpha)``'s ops on the product: times alpha, plus the bias
    read as ``[b, h, l, S]``; or [why not]."""
    beta, alpha = product.kwargs.get("beta", 1), product.kwargs.get("alpha", 1)
    bias, bv = product.args[0], tensor_val(product.args[0])
    if len(product.args) > 3 or beta != 1 or _number(alpha) is None:
        return [f"{product.name}: baddbmm with beta {beta}, alpha {alpha}"]
    if bv is None or bv.dim() != 3 or bv.shape[0] not in (1, batch * heads):
        return [f"{product.name}: a bias of another shape than [B * H, l, S]"]
    per_head = bv.shape[0] != 1
    view4 = (batch if per_head else 1, heads if per_head else 1, *bv.shape[1:])
    return ([Op(aten.mul.Tensor, float(alpha))] if alpha != 1 else []) + \
        [Op(aten.add.Tensor, bias, view4=view4)]
