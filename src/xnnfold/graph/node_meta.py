"""What export recorded about a node: its ``meta["val"]``, the fake tensor the pass reads shapes,
dtypes and strides from. A leaf module."""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx


def tensor_val(node) -> Optional[torch.Tensor]:
    """``node.meta["val"]`` if ``node`` is a graph node whose value is one tensor, else None
    (a constant argument, a node of several outputs, a symbolic scalar, a node without it)."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None
