"""A model case: the model, its example inputs, its ideal rewrite if it has one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import nn


@dataclass
class Case:
    """A model, its example inputs, and optionally its ideal rewrite and dynamic shapes."""

    name: str
    model: nn.Module
    inputs: tuple
    ideal: Optional[nn.Module] = None
    dynamic_shapes: Optional[object] = None
    program: Any = None      # a saved ExportedProgram (a .pt2): lowered as it is, not re-exported
    # the same model exported another way users can choose (transformers' eager attention),
    # built on demand: the report's variant "eager-export", lowered with stock
    eager_export: Optional[Callable[[], nn.Module]] = None
