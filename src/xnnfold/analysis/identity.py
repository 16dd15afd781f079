"""Identity ops: what decomposition hands on unchanged.

Some ops in an exported program are no-ops on their input: a same-dtype ``to`` (the
mixed-precision idiom ``w.to(x.dtype)``), ``type_as``, ``contiguous`` of a contiguous tensor, a
no-op ``flatten``. ``run_decompositions`` replaces each by its input, so stock's partitioner
sees the param itself and delegates the GEMM. xnnfold leaves such operands as they are, and
reads only the first input of such an op (``w.type_as(x)`` depends on ``w`` alone).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ..graph.node_meta import tensor_val


def has_symbols(value) -> bool:
    if isinstance(value, torch.Tensor):
        return any(not isinstance(s, int) for s in value.shape)
    if isinstance(value, (list, tuple)):
        return any(has_symbols(v) for v in value)
    return not isinstance(value, (int, float, bool, str, type(None), torch.dtype,
                                  torch.device, torch.layout, torch.memory_format))


def is_identity(node: torch.fx.Node) -> bool:
    """True if ``node``'s op, on its input, decomposes to that very input.

    Asked of the op's own CompositeImplicitAutograd kernel on a meta tensor of the input's
    shape, strides and dtype: a same-dtype ``to``, ``type_as``, ``contiguous`` of a contiguous
    tensor, a no-op ``flatten``. Decomposition then hands the GEMM the param itself, and stock
    delegates it; ``alias``, ``detach``, ``view``, ``clone`` have kernels of their own and stay.
    """
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not node.args or \
            not isinstance(node.args[0], torch.fx.Node) or \
            not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                               "CompositeImplicitAutograd"):
        return False
    probe = _meta_like(node.args[0])
    if probe is None:
        return False
    # Other tensor arguments (``type_as``'s reference) count for their dtype.
    args, kwargs = torch.fx.node.map_arg(
        (node.args[1:], node.kwargs), lambda n: _meta_like(n, concrete=False))
    try:
        return op.decompose(probe, *args, **kwargs) is probe
    except Exception:  # noqa: BLE001 - an op that cannot run on meta is no identity
        return False


def _meta_like(node: torch.fx.Node, concrete: bool = True) -> Optional[torch.Tensor]:
    val = tensor_val(node)
    if val is None:
        return None
    if has_symbols(val):
        if concrete:
            return None
        return torch.empty((1,) * val.dim(), dtype=val.dtype, device="meta")
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")


def removed_by_decomposition(node: torch.fx.Node) -> Optional[list]:
    """The chain of identity ops from a param to ``node``, if that is all ``node`` is.

    The ops may read other tensors, user inputs included (``w.type_as(x)``): only the
    param's value reaches the GEMM.
    """
    chain = []
    while node.op == "call_function" and is_identity(node):
        chain.append(node)
        node = node.args[0]
    return list(reversed(chain)) if chain and node.op == "placeholder" else None
