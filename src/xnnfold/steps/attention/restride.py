"""A rewritten attention's users, kept traceable when its output's strides differ.

``scaled_dot_product_attention`` on CPU returns its ``[N, H, L, E]`` output laid out as
``[N, L, H, E]`` (the flash kernel allocates it so, and torch's decomposition for export keeps
that layout with ``transpose(1, 2).contiguous().transpose(1, 2)``). Code written as
``out.permute(2, 0, 1, 3).contiguous().view(...)`` or ``out.transpose(1, 2).contiguous()
.view(...)`` is traced on those strides: the ``contiguous`` is a no-op there and leaves no node,
and the ``view`` that follows relies on them. The rewrite's output is a plain contiguous
``[N, H, L, E]``: the same values, other strides, and that ``view`` cannot be retraced —
``run_decompositions`` raises ``Cannot view a tensor with shape ...`` where stock lowers.

:func:`replace_uses` hands the users the new node and refreshes the fake values downstream for
as long as the strides differ; a ``view`` that is no longer possible becomes ``reshape``, which
computes the same values (it copies where ``contiguous`` would have: on the runtime every
tensor is contiguous anyway, and XNNPACK drops the copy). Values, shapes and dtypes never
change; only strides do.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten


def _same_layout(a, b) -> bool:
    """Equal strides on every dim of size other than 1 (a size-1 dim's stride is arbitrary),
    decided without adding guards to the ShapeEnv."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b))
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True
    if a.dim() != b.dim():
        return False
    for size, sa, sb in zip(a.shape, a.stride(), b.stride()):
        if statically_known_true(size == 1):
            continue
        if not statically_known_true(sa == sb):
            return False
    return True


def _recompute(node: torch.fx.Node, vals: dict, fake_mode):
    def val_of(arg):
        return vals.get(arg, arg.meta.get("val"))

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), val_of)
    with fake_mode:
        return node.target(*args, **kwargs)


def plan_restride(old: torch.fx.Node, new: torch.fx.Node) -> tuple:
    """({node: its fake value once ``old``'s users read ``new``}, [views to become reshape]),
    for the users downstream whose strides change; raises if one cannot be recomputed."""
    vals, views = {old: new.meta["val"]}, []
    if _same_layout(old.meta.get("val"), new.meta["val"]):
        return {}, []
    fake_mode = detect_fake_mode([new.meta["val"]])
    order = {n: i for i, n in enumerate(old.graph.nodes)}
    pending = sorted(old.users, key=order.__getitem__)
    seen = set(pending)
    while pending:
        node = pending.pop(0)
        if node.op != "call_function":
            continue
        try:
            value = _recompute(node, vals, fake_mode)
        except Exception:   # noqa: BLE001 - a view of the new strides: reshape, or give up
            if node.target is not aten.view.default:
                raise
            views.append(node)
            value = _recompute_as(node, aten.reshape.default, vals, fake_mode)
        if _same_layout(node.meta.get("val"), value):
            continue          # strides as before: nothing further down changes
        vals[node] = value
        for user in node.users:
            if user not in seen:
                seen.add(user)
                pending.append(user)
        pending.sort(key=order.__getitem__)
    del vals[old]
    return vals, views


def _recompute_as(node, target, vals, fake_mode):
    saved = node.target
    node.target = target
    try:
        return _recompute(node, vals, fake_mode)
    finally:
        node.target = saved


def replace_uses(old: torch.fx.Node, new: torch.fx.Node) -> None:
    """``old.replace_all_uses_with(new)``, the users' fake values refreshed and the views that
    the new strides forbid turned into reshapes. Plans first: a failure changes nothing."""
    vals, views = plan_restride(old, new)
    old.replace_all_uses_with(new)
    for node in views:
        node.target = aten.reshape.default
    for node, value in vals.items():
        node.meta["val"] = value
