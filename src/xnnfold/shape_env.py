"""Keep xnnfold's lowerings out of the caller's ShapeEnv.

A program with a data-dependent size (``.item()``, ``nonzero``, boolean-mask indexing) carries
unbacked symbols, and every copy of it shares its ShapeEnv with the caller's ExportedProgram.
executorch's edge passes and verifiers re-run such ops on fake tensors outside any tracer: each
run leaves a fresh unbacked symbol in ``ShapeEnv.pending_fresh_unbacked_symbols`` that nothing
binds, and the next ``run_decompositions`` of any program of that ShapeEnv raises
``PendingUnbackedSymbolNotFound`` (measured with stock alone: lowering the same program twice
fails). So xnnfold gives the program it lowers, and the programs it probes, a ShapeEnv of their
own: fresh placeholder fake tensors, from which the lowering's first ``run_decompositions``
retraces everything. Only programs of a ShapeEnv that made unbacked symbols need it (a program
the pass freed of them, as :mod:`xnnfold.steps.mask_index` does, still shares the caller's);
others are left as they are.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StrictMinMaxConstraint,
    free_unbacked_symbols,
)
from torch._dynamo.source import ConstantSource

from .errors import FoldError, warn_or_raise
from .graph.node_meta import tensor_val
from .graph.program_copy import copy_program

logger = logging.getLogger("xnnfold")


def shape_env_of(program: ExportedProgram) -> Optional[ShapeEnv]:
    for node in program.graph.nodes:
        val = tensor_val(node)
        if val is not None and getattr(val, "fake_mode", None) is not None:
            return val.fake_mode.shape_env
    return None


def has_unbacked_symbols(program: ExportedProgram) -> bool:
    for node in program.graph.nodes:
        values = node.meta.get("val")
        values = values if isinstance(values, (list, tuple)) else [values]
        if any(isinstance(v, (torch.Tensor, torch.SymInt)) and free_unbacked_symbols(v)
               for v in values):
            return True
    return False


def needs_own_shape_env(program: ExportedProgram) -> bool:
    """``program`` has unbacked symbols, or shares a ShapeEnv that made some (the caller's,
    which an earlier lowering of the caller's program may have left unbound symbols in)."""
    if has_unbacked_symbols(program):
        return True
    env = shape_env_of(program)
    return env is not None and (env.unbacked_symint_counter > 0 or
                                env.unbacked_symfloat_counter > 0)


def give_own_shape_env(program: ExportedProgram) -> None:
    """Rebind ``program``'s placeholders to fake tensors of a new FakeTensorMode and ShapeEnv,
    in place (``program`` must be the caller's own copy). Backed symbols of the inputs are
    recreated one for one, with the program's ranges; ``range_constraints`` is renamed to
    match. Does nothing for a program that does not need it (:func:`needs_own_shape_env`)."""
    if not needs_own_shape_env(program):
        return
    old = shape_env_of(program)
    env = ShapeEnv()
    # The retrace binds each new unbacked symbol back to the name the graph's meta gives it
    # (u0, ...); new ones must not be born with those names.
    env.unbacked_symint_counter = old.unbacked_symint_counter
    env.unbacked_symfloat_counter = old.unbacked_symfloat_counter
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True, export=True)
    renamed: dict = {}

    def new_size(size, where: str):
        if isinstance(size, int):
            return size
        expr = size.node.expr
        for symbol in expr.free_symbols:
            if symbol in renamed:
                continue
            bounds = program.range_constraints.get(symbol)
            hint = size.node.shape_env.var_to_val.get(symbol)
            if bounds is None or hint is None:
                raise FoldError(where, f"input size {expr} has no range or hint")
            renamed[symbol] = env.create_symbol(
                int(hint), ConstantSource(f"xnnfold_{symbol}"), dynamic_dim=DimDynamic.DYNAMIC,
                constraint_dim=StrictMinMaxConstraint(vr=bounds, warn_only=False))
        new_expr = expr.xreplace(renamed)
        return env.create_symintnode(new_expr, hint=int(size.node.hint))

    fresh = {}
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        val = tensor_val(node)
        if val is None:
            continue
        shape = [new_size(s, node.name) for s in val.shape]
        with mode:
            new = torch.empty(shape, dtype=val.dtype, device=val.device)
        if isinstance(val, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=val.requires_grad)
        fresh[node] = new
    for node, new in fresh.items():
        node.meta["val"] = new
    # The retrace would bind each new unbacked symbol back to the old one the meta names (and
    # look up its range in the new ShapeEnv, which never had it): let it keep the new names.
    for node in program.graph.nodes:
        node.meta.pop("unbacked_bindings", None)
    # The unbacked symbols are made anew by the retrace; only the inputs' ranges carry over.
    program._range_constraints = {renamed[symbol]: bounds
                                  for symbol, bounds in program.range_constraints.items()
                                  if symbol in renamed}


def for_lowering(ep: ExportedProgram, program: ExportedProgram) -> ExportedProgram:
    """What the hook hands the lowering for ``program`` (the fold's result for ``ep``): a copy,
    because the lowering deletes the constants it moves into delegates from the constants dict
    of the program it is given (``run_decompositions`` shares that dict), and with a ShapeEnv
    of its own when ``program`` has data-dependent sizes or shares a ShapeEnv that made some:
    the lowering leaves unbound symbols in its ShapeEnv (see :mod:`xnnfold.shape_env`), which
    would make the next lowering of ``ep`` raise, and an earlier lowering of ``ep`` may have
    left some that would make this one raise. ``program`` itself stays the valid program the
    fold returned (the isolated copy does not round-trip through ``torch.export.save``: its
    nodes name symbols its ShapeEnv never had). ``ep`` itself when nothing needs doing."""
    isolate = needs_own_shape_env(program)
    if program is ep and not isolate:
        return ep                     # stock's lowering of the caller's program, exactly
    lowered = copy_program(program)
    if isolate:
        try:
            give_own_shape_env(lowered)
        except Exception as error:  # noqa: BLE001 - lowering still works, as stock's does
            warn_or_raise(logger, "xnnfold: could not give the program its own ShapeEnv "
                          "(%s: %s); lowering it leaves unbound symbols in the caller's "
                          "program, as a stock lowering does", type(error).__name__, error)
            return copy_program(program)
    return lowered
