"""Measure a lowering: what is left outside delegates, .pte bytes, and runs on the runtime.

One place for the numbers the tests assert and the report prints, so the two never disagree.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from executorch.exir import to_edge_transform_and_lower
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ..analysis.gemms import EDGE_GEMM_NAMES, EDGE_SPLIT_NAMES, op_name, source_module
from ..partitioner import XnnpackPartitioner
from .variants import CONSTANT_PROP, STOCK, STOCK_FLAG, XNNFOLD, XNNFOLD_SIZE
_FLAG = {"force_non_static_weights_for_f32_linear": True}
_QUANT_OP_HINTS = ("quantize_per", "dequantize_per", "quantize_affine", "dequantize_affine")


@dataclass
class HeldConstant:
    """A constant tensor the lowered program stores, in a delegate or for portable ops."""

    name: str
    shape: tuple
    dtype: torch.dtype


@dataclass
class Lowered:
    """One lowered program and what its graph says."""

    variant: str
    pte: bytes
    ops_outside: list                  # edge op names of call_functions outside delegates
    delegate_calls: int
    delegate_constants: list           # HeldConstant, over all delegates
    program_constants: list            # HeldConstant read by ops outside delegates
    lower_seconds: float
    fold: object = None                # FoldResult, for the xnnfold variant
    delegation: dict = None            # devtools.delegation(): ops in and out, by op type
    gemm_sources_outside: list = None  # (node, "module (Class)") of each GEMM outside delegates
    largest_outside: dict = None       # {op name outside delegates: its largest output numel}
    quantized_ops: dict = None         # {op name: how many XNNPACK took as quantized ops}

    @property
    def pte_bytes(self) -> int:
        return len(self.pte)

    @property
    def gemms_outside(self) -> list:
        return [name for name in self.ops_outside if name in EDGE_GEMM_NAMES]

    @property
    def splits_outside(self) -> list:
        return [name for name in self.ops_outside if name in EDGE_SPLIT_NAMES]

    @property
    def quant_ops_outside(self) -> list:
        return [n for n in self.ops_outside if any(h in n for h in _QUANT_OP_HINTS)]

    @property
    def constant_bytes(self) -> int:
        """Tensor data the .pte holds: constants of portable ops plus those of each delegate
        (a constant in two places counts twice, as it is stored twice)."""
        return sum(math.prod(c.shape) * c.dtype.itemsize
                   for c in self.delegate_constants + self.program_constants)

    def constant_shapes(self) -> list:
        return sorted(tuple(c.shape) for c in self.delegate_constants)


def _constants(program: ExportedProgram) -> list:
    """The non-input placeholders of ``program`` that something reads."""
    kinds = {s.arg.name: s.kind for s in program.graph_signature.input_specs}
    return [HeldConstant(n.name, tuple(n.meta["val"].shape), n.meta["val"].dtype)
            for n in program.graph.nodes
            if n.op == "placeholder" and n.users and kinds.get(n.name) != InputKind.USER_INPUT]


def _delegate_constants(edge_program: ExportedProgram) -> list:
    constants = []
    module = edge_program.graph_module
    for node in edge_program.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module"):
            constants += _constants(getattr(module, node.target).original_module)
    return constants


def inspect_lowered(edge_program: ExportedProgram) -> tuple:
    """(op names outside delegates, delegate call count, delegate constants, other constants)."""
    ops, calls = [], 0
    for node in edge_program.graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        if "executorch_call_delegate" in name:
            calls += 1
        elif name != "getitem":
            ops.append(name)
    return ops, calls, _delegate_constants(edge_program), _constants(edge_program)


def lower(ep: ExportedProgram, variant: str = XNNFOLD, partitioner_kwargs: Optional[dict] = None
          ) -> Lowered:
    """Lower ``ep`` to a .pte with the stock partitioner, xnnfold (``XNNFOLD_SIZE``: with
    ``prefer="size"``), constant_prop_pass+stock, or stock with
    ``force_non_static_weights_for_f32_linear`` (``STOCK_FLAG``)."""
    from .devtools import delegation

    kwargs = partitioner_kwargs or {}
    start = time.perf_counter()
    if variant == XNNFOLD:
        partitioner = XnnpackPartitioner(**kwargs)
    elif variant == XNNFOLD_SIZE:
        partitioner = XnnpackPartitioner(**{**kwargs, "prefer": "size"})
    elif variant == STOCK_FLAG:
        partitioner = StockXnnpackPartitioner(**{**kwargs, **_FLAG})
    elif variant in (STOCK, CONSTANT_PROP):
        partitioner = StockXnnpackPartitioner(**kwargs)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    if variant == CONSTANT_PROP:
        from executorch.exir.passes.constant_prop_pass import constant_prop_pass
        ep = constant_prop_pass(ep.run_decompositions({}))
    if _has_quantized_ops(ep):
        import executorch.kernels.quantized  # noqa: F401 - registers the out variants
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    ops, calls, constants, kept = inspect_lowered(edge.exported_program())
    paused = time.perf_counter()      # reading the delegation and GEMMs is not part of lowering
    delegated = delegation(edge.exported_program().graph_module)
    outside = _gemm_sources_outside(edge.exported_program())
    largest = _largest_outside(edge.exported_program())
    quantized = taken_as_quantized(edge.exported_program())
    start += time.perf_counter() - paused
    pte = edge.to_executorch().buffer
    return Lowered(variant, pte, ops, calls, constants, kept, time.perf_counter() - start,
                   getattr(partitioner, "last_result", None), delegated, outside, largest,
                   quantized)


def taken_as_quantized(edge_program: ExportedProgram) -> dict:
    """{op name: count} of the ops inside delegates that XNNPACK takes as quantized ones: those
    reading a dequantize it fused into them (tagged as an implicit q/dq by its partitioner
    configs, ``tag_as_implicit_q_dq``); the other ops of a delegate compute in fp32."""
    from executorch.backends.xnnpack.utils.quant_utils import (
        is_dequant, is_quant, is_tagged_as_implicit_q_dq)

    counts: dict = {}
    module = edge_program.graph_module
    for node in edge_program.graph.nodes:
        if node.op != "get_attr" or not node.target.startswith("lowered_module"):
            continue
        for inner in getattr(module, node.target).original_module.graph.nodes:
            if inner.op != "call_function" or is_quant(inner) or is_dequant(inner):
                continue
            if any(is_dequant(i) and is_tagged_as_implicit_q_dq(i)
                   for i in inner.all_input_nodes):
                name = op_name(inner.target)
                counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _gemm_sources_outside(edge_program: ExportedProgram) -> list:
    """The GEMMs left outside delegates, each with the module of the user's code it came from
    (decomposition carries ``nn_module_stack`` to the edge ops)."""
    return [(node.name, source_module(node)) for node in edge_program.graph.nodes
            if node.op == "call_function" and op_name(node.target) in EDGE_GEMM_NAMES]


def _largest_outside(edge_program: ExportedProgram) -> dict:
    """{op name: largest output numel} of the ops outside delegates: what a step that takes
    glue off portable still leaves there, by size (a dynamic size at the example's value)."""
    sizes = {}
    for node in edge_program.graph.nodes:
        name = op_name(node.target) if node.op == "call_function" else ""
        val = node.meta.get("val")
        if name and "executorch_call_delegate" not in name and name != "getitem" and \
                isinstance(val, torch.Tensor):
            sizes[name] = max(sizes.get(name, 0), _numel_hint(val))
    return sizes


def _numel_hint(val: torch.Tensor) -> int:
    """``val.numel()`` as a plain int, without touching the ShapeEnv: comparing a symbolic size
    adds a guard, which narrows the program's ranges (its memory plan then fits the example
    only) or raises on a data-dependent size. A symbol's hint is read instead (0 if none)."""
    numel = val.numel()
    if isinstance(numel, int):
        return numel
    hint = getattr(numel.node, "hint", None)
    return int(hint) if hint is not None else 0


def _has_quantized_ops(ep: ExportedProgram) -> bool:
    return any(n.op == "call_function" and any(h in op_name(n.target) for h in _QUANT_OP_HINTS)
               for n in ep.graph.nodes)
