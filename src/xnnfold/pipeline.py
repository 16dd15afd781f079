"""The whole pass: mask indexing -> KV caches -> attention rewritten -> canonical GEMMs ->
projections -> analysis -> plan and rules -> fold -> probe, repeated until the probe agrees ->
runtime weights.

``run`` never raises for a failure of its own: it logs one warning naming the node and the
reason and returns the input program untouched, which lowers exactly as stock lowers it (in
strict mode, ``XNNFOLD_STRICT=1``, a test setting, it raises ``StrictFallback`` instead: every
give-up of the pass goes through :func:`xnnfold.errors.warn_or_raise`).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from . import rules
from .steps.fold import plan
from .analysis import ProgramFacts, find_operands, find_static
from .steps.attention import rewrite_attention
from .steps.kv_cache import rewrite_kv_caches
from .steps.canonical import canonicalize
from .steps.mask_index import rewrite_mask_indexing
from .steps.gelu_tanh import rewrite_tanh_gelus
from .steps.runtime_weight import mark_runtime_weights
from .errors import FoldError, StrictFallback, warn_or_raise
from .steps.fold.evaluate import ConeEvaluator
from .steps.fold import apply_folds
from .program_copy import copy_program, copy_with_nodes
from .steps.projections import find_packed_projections, split_packed_projections
from .validity import StepChecks
from .probe.verified import Verification
# FoldResult and GemmOperand are part of this module's interface (pipeline.FoldResult)
from .result import FoldResult, GemmOperand, describe, row_of  # noqa: F401
from .decision import Decline, Found, Rule
from .rules import DEFAULT_RULES, RuleSet

logger = logging.getLogger("xnnfold")

# A probe answers: which of these folded constants (fold.FoldedConstant) of this program end up
# in a delegate? (state_dict / constants keys; see xnnfold.probe.verified)
Probe = Callable[[ExportedProgram, list], set]


def _split_and_fold(ep: ExportedProgram, probe: Optional[Probe], rule_set: RuleSet,
                    attention: bool = True, llm_kernels: bool = False) -> FoldResult:
    """Index by masks rather than their ``where``, rewrite attention over KV caches (on
    executorch's LLM kernels with ``llm_kernels``) and other attention (unless ``attention`` is
    False), canonicalize GEMMs, split packed projections, then fold; undo each split whose
    parts were not all folded and delegated (rule *split*).

    ``ep`` is only read: the pass copies it once (graph and signature; tensors are shared) and
    rewrites that copy. Each site thus ends either fully split, folded and delegated, or exactly
    as it was.
    """
    check = StepChecks(ep)    # each step's program passes torch's checker, or the pass falls back
    base = copy_program(ep)
    indexed = rewrite_mask_indexing(base)
    check(base, "mask_index")
    gelus = rewrite_tanh_gelus(base)
    check(base, "gelu_tanh")
    cached = rewrite_kv_caches(base, llm_kernels) if attention else []
    check(base, "kv_cache")
    attended = rewrite_attention(base) if attention else []
    check(base, "attention")
    facts = find_static(base)
    rewrites = canonicalize(base, facts.static)
    if rewrites:
        check(base, "canonical")
        facts = find_static(base)     # the rewritten graph
    sites, kept = find_packed_projections(facts), []
    while True:
        program_facts = facts
        if sites:   # a split round: a copy of the rewritten program, split and analysed
            program, nodes = copy_with_nodes(base)
            split_packed_projections(program, sites, nodes)
            check(program, "projections")
            program_facts = find_static(program)
        result = _fold_and_probe(program_facts, probe, rule_set)
        check(result.program, "fold")
        rows = {(row.gemm, row.role): row for row in result.operands}
        newly_kept = []
        for site in sites:
            site.kept_because = rules.split_kept(site, rows)
            if site.kept_because is not None:
                newly_kept.append(site)
        if not newly_kept:
            break
        kept += newly_kept
        sites = [s for s in sites if s not in newly_kept]
    for site in kept:
        site.part_linears = {}
    result.projections = sites + kept
    result.canonical = rewrites
    result.attention = attended
    result.mask_index = indexed
    result.kv_cache = cached
    result.gelu_tanh = gelus
    mark_runtime_weights(result, rule_set.prefer)
    check(result.program, "runtime_weight")
    if result.program is base and not rewrites and not indexed and \
            not any(a.rewritten for a in attended) and not any(c.rewritten for c in cached) and \
            not any(g.rewritten for g in gelus) and \
            not any(row.runtime_weight for row in result.operands):
        result.program = ep    # nothing changed: the caller's own program
    return result


def _fold_and_probe(facts: ProgramFacts, probe: Optional[Probe], rule_set: RuleSet
                    ) -> FoldResult:
    """Plan and fold ``facts.ep``; ask the probe which GEMMs XNNPACK takes, and fold again
    without the groups it takes none of, until the probe agrees. Each round folds into a fresh
    copy of ``facts.ep``; values are evaluated once, for all rounds."""
    program = facts.ep
    operands = find_operands(program, facts)
    targets = [op.target for op in operands if op.status == Found.TARGET]
    groups = plan.group_fold_nodes(plan.fold_nodes(targets))
    rules.apply(groups, facts, rule_set.before_probe)
    evaluator = ConeEvaluator(facts)

    folded, rounds = None, 0
    # Each round that changes anything declines at least one more group: this terminates.
    for _ in range(len(groups) + 1):
        members = [m for g in groups for m in g.to_fold]
        if not members:
            folded = None
            break
        folded = apply_folds(program, evaluator, members)
        if probe is None:
            break
        rounds += 1
        constants = {c.source: c.name for c in folded.constants}
        taken = probe(folded.program, folded.constants)
        for member in members:
            member.delegated = constants[member.name] in taken
        if not rules.apply(groups, facts, rule_set.after_probe):
            break

    constants = {c.source: c.name for c in folded.constants} if folded else {}
    result = FoldResult(folded.program if folded else program,
                        describe(operands, groups, constants), probe_rounds=rounds)
    if folded:
        result.constants, result.freed_params = folded.constants, folded.freed_params
    return result


def stored_bytes(ep: ExportedProgram) -> int:
    """Bytes of the params, buffers and lifted constants ``ep``'s signature lists."""
    tensors = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if isinstance(value, torch.Tensor):
                tensors[spec.target] = value.numel() * value.element_size()
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


def run(ep: ExportedProgram, probe: Optional[Probe],
        rule_set: RuleSet = DEFAULT_RULES, attention: bool = True,
        verification: Optional[Verification] = None, llm_kernels: bool = False) -> FoldResult:
    """Fold what the rules allow; on any internal failure, warn once and return ``ep``.
    ``attention``: run the KV-cache and attention steps (:mod:`xnnfold.steps.kv_cache`,
    :mod:`xnnfold.steps.attention`); ``llm_kernels``: the KV-cache step may use executorch's
    LLM kernels. ``verification``: the one the probe reports its answers to, told where the
    fold ends (its last answer is checked then, or left for a lowering's ``partition()``: a
    disagreement is a failure of the fold)."""
    try:
        result = _split_and_fold(ep, probe, rule_set, attention, llm_kernels)
        check_no_growth(ep, result)
        if verification is not None:
            verification.fold_done(result.program)
        result.modified = result.program is not ep
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

