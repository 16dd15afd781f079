"""The whole pass: a list of steps (:data:`STEPS`), each one module exposing one object
(:mod:`xnnfold.steps.protocol`), run in order on the pass's own copy of the program.

mask indexing -> KV caches -> attention -> tanh GELU -> canonical GEMMs -> fold (packed
projections split, analysis, plan, rules, probe, the split undone where it did not pay) ->
run-time weights.

Adding a step is a module and an entry in :data:`STEPS`. The pipeline holds each step to the
protocol (:mod:`xnnfold.steps.protocol`) by the graph: a fingerprint of the program before and
after the step (:mod:`xnnfold.graph.fingerprint`) that differs while no record of the step says
it rewrote is a failure of the pass, naming the step (:func:`run_steps`). After a step that
rewrote, the pipeline tidies the program once (:func:`~xnnfold.graph.validity.tidy`: dead
nodes, recompile, output specs); after each step the program passes torch's checker
(:class:`~xnnfold.graph.validity.StepChecks`); the records are kept by step name. The program
returned is the caller's own unless some record rewrote; a fold that would store more bytes
than the input is never returned (:func:`check_no_growth`).

``run`` never raises for a failure of its own: it logs one warning naming the node and the
reason and returns the input program untouched, which lowers exactly as stock lowers it (in
strict mode, ``xnnfold.config``'s ``strict``, a test setting, it raises ``StrictFallback``
instead: every give-up of the pass goes through :func:`xnnfold.errors.warn_or_raise`).
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from .analysis import find_operands
from .decision import Decline, Found, Rule
from .errors import FoldError, StrictFallback, warn_or_raise
from .graph.program_copy import copy_program
from .result import FoldResult
from .steps import (attention, canonical, dynamic_views, fold, gelu_tanh, kv_cache, mask_index,
                    powers, runtime_weight, tied_table)
from .steps.fold.probe.verified import Verification
from .steps.fold.rows import row_of
from .steps.fold.rules import DEFAULT_RULES, RuleSet
from .steps.protocol import Context, Probe
from .graph.fingerprint import Fingerprint, first_change
from .graph.validity import StepChecks, tidy

logger = logging.getLogger("xnnfold")

# The steps, in the order a program takes them.
STEPS = (mask_index.STEP, kv_cache.STEP, attention.STEP, gelu_tanh.STEP, powers.STEP,
         canonical.STEP, fold.STEP, runtime_weight.STEP, tied_table.STEP, dynamic_views.STEP)
# The steps that rewrite attention (``attention=False`` leaves it as stock decomposes it).
ATTENTION_STEPS = (kv_cache.STEP.name, attention.STEP.name)


def run_steps(ep: ExportedProgram, context: Context, steps: Sequence) -> FoldResult:
    """Run ``steps`` on a copy of ``ep`` (graph and signature; tensors are shared); ``ep`` is
    only read."""
    check = StepChecks(ep)    # each step's program passes torch's checker, or the pass falls back
    context.check = check
    program = copy_program(ep)
    for step in steps:
        before = Fingerprint.of(program)
        outcome = step.run(program, context)
        if outcome.program is not None:
            program = outcome.program
        records = list(outcome.records)
        _check_protocol(step.name, records, first_change(before, Fingerprint.of(program)))
        if any(r.rewritten for r in records):
            tidy(program, before.dead)
        check(program, step.name)
        context.records[step.name] = records
    result = FoldResult(program, context.operands, context.records, context.constants,
                        context.freed_params, context.probe_rounds)
    if not result.modified:
        result.program = ep       # nothing rewritten: the caller's own program
    return result


def _check_protocol(step: str, records: list, change) -> None:
    """A step's records against what it changed (``change``: ``(where, what)`` or None).

    A change no record reports would ship unexplained whenever another step rewrote (or be
    thrown away when none did): a :class:`FoldError`, so the pass falls back to stock (in
    strict mode, raises). A record that says it rewrote where nothing changed misreports only
    itself: warned (strict mode: raised), the program kept."""
    rewrote = any(r.rewritten for r in records)
    if change is not None and not rewrote:
        where, what = change
        raise FoldError(where, f"the {step} step changed the program ({what}) but none of its "
                               "records says it rewrote")
    if change is None and rewrote:
        warn_or_raise(logger, "xnnfold: the %s step says it rewrote %s but the program is "
                      "unchanged", step, next(r for r in records if r.rewritten).describe())


def stored_bytes(ep: ExportedProgram) -> int:
    """Bytes of the params, buffers and lifted constants ``ep``'s signature lists, a tensor
    listed under two names once (executorch stores a tensor's bytes once: its emitter and
    XNNPACK's serialization key them by their hash)."""
    tensors = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if isinstance(value, torch.Tensor):
                tensors[id(value)] = value.numel() * value.element_size()
    return sum(tensors.values())


def check_no_growth(ep: ExportedProgram, result: FoldResult) -> None:
    """The promise that the .pte never grows, kept by the result rather than by the rules:
    whatever the rules missed, a fold that stores more than the input is not returned."""
    if result.program is ep:
        return
    before, after = stored_bytes(ep), stored_bytes(result.program)
    if after > before:
        raise FoldError("<program>", f"the folded program would store {after:,} bytes of "
                                     f"params and constants, more than the input's {before:,}")


def run(ep: ExportedProgram, probe: Optional[Probe], rule_set: RuleSet = DEFAULT_RULES,
        attention: bool = True, verification: Optional[Verification] = None,
        llm_kernels: bool = False, steps: Optional[Sequence] = None) -> FoldResult:
    """Run the pass; on any internal failure, warn once and return ``ep``. ``steps``: the
    steps to run (default :data:`STEPS`); ``attention=False`` leaves out the KV-cache and
    attention steps; ``llm_kernels``: the KV-cache step may use executorch's LLM kernels.
    ``verification``: the one the probe reports its answers to, told where the fold ends (its
    last answer is checked then, or left for a lowering's ``partition()``: a disagreement is a
    failure of the fold)."""
    steps = [s for s in (STEPS if steps is None else steps)
             if attention or s.name not in ATTENTION_STEPS]
    try:
        result = run_steps(ep, Context(rule_set, probe, llm_kernels), steps)
        check_no_growth(ep, result)
        if verification is not None:
            verification.fold_done(result.program)
        return result
    except StrictFallback:
        raise     # a step's own give-up, in strict mode: its message names the node
    except FoldError as error:
        where, why = error.node, error.reason
    except Exception as error:  # noqa: BLE001 - never fail a lowering stock would pass
        where, why = "<program>", f"{type(error).__name__}: {error}"
    warn_or_raise(logger, "xnnfold: folding skipped at node %r: %s; lowering as the stock "
                  "XnnpackPartitioner would", where, why)
    return FoldResult(ep, _unfolded_rows(ep, where, why), fallback=f"at node {where!r}: {why}")


def _unfolded_rows(ep: ExportedProgram, where: str, why: str) -> list:
    """After a fallback, still say what each GEMM operand is, if analysis alone can."""
    try:
        operands = find_operands(ep)
    except Exception:  # noqa: BLE001 - the warning already names the failure
        return []
    return [row_of(o) if o.status == Found.PLAIN else
            row_of(o, Decline(Rule.INTERNAL, where, why)) for o in operands]
