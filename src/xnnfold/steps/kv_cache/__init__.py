"""The KV-cache step: a decoder LM's attention over its static KV cache off portable.

transformers' ExecuTorch export (``TorchExportableModuleForDecoderOnlyLM``, static cache) and
executorch's example Llama with its plain KV cache write each step's keys and values into a
buffer ``[B, Hkv, S, D]`` in place and attend over the whole buffer under a mask built from the
cache position, repeating it for grouped-query attention. Lowered as it is, the repeat is an
``expand_copy`` (and an ``unsqueeze_copy``) of the whole cache on portable per layer and step,
and SDPA's safe-softmax glue sits between three delegates. transformers' exporter's ``decode``
(``export_for_generation``) writes the same cache given as an input, and returns it: the step
takes it the same way, the cache keeping the caller's shape (:mod:`.decide`).

For each attention, the step first decides (:mod:`.decide`: a :class:`.plan.Plan` or
:class:`.plan.Declined`), then carries the plan out (:mod:`.rewrite`), on the pass's own copy of
the program:

- by default (:mod:`.grouped`) into ops XNNPACK takes, the query heads of a KV head folded into
  the rows of one product with the cache, nothing repeated; runs on any runtime with XNNPACK
  and the portable kernels;
- with ``llm_kernels=True`` (:mod:`.llm_kernels`), where the positions and the mask are proven
  (:mod:`.positions`, :mod:`.mask_proof`), onto executorch's ``llama::update_cache`` (in place)
  and ``llama::custom_sdpa`` (only the rows up to the position), the kernels of its own LLM flow.

An attention is an SDPA (:mod:`.pattern`) or written out op by op (:mod:`.eager`: Gemma2's
soft-capping, ALiBi biases); the latter keeps its own ops on the scores (:mod:`.scores`).

An attention the step does not take is left as it was and says why; one it does not recognise
as reading a cache is not its business (the attention step, next, rewrites it as any other).
"""

from __future__ import annotations

import logging
from typing import Optional

from torch.export import ExportedProgram

from ...errors import warn_or_raise
from ...graph.sdpa import SDPA, merge_mask_repeats
from ..protocol import Context, Outcome
from . import eager, grouped, llm_kernels, pattern
from .decide import Facts, decide
from .plan import Declined
from .record import KVCacheRewrite
from .rewrite import Built, carry_out

logger = logging.getLogger("xnnfold")


def rewrite_kv_caches(program: ExportedProgram, llm_kernels_wanted: bool = False,
                      visible_rows: bool = False) -> list:
    """Rewrite, in place, every attention of ``program`` (the pass's own copy) over a KV cache
    the step recognises; return a :class:`KVCacheRewrite` for each, rewritten or kept.
    ``visible_rows``: the default rewrite reads only the rows up to the position where that is
    exact (:mod:`.visible`); only for a partitioner that takes them
    (:mod:`.visible_config`)."""
    updates, _ = pattern.find_updates(program)
    if not updates:
        return []
    facts = Facts(program, updates, llm_kernels_wanted, visible_rows)
    if llm_kernels_wanted:
        llm_kernels.load_kernels()
    built, records = Built(), []
    before = set(program.graph.nodes)
    for node in list(program.graph.nodes):
        if node.op != "call_function" or node.target not in (SDPA,) + eager.SOFTMAXES:
            continue
        # the decision too: a failure anywhere keeps this attention as stock has it (what
        # carry_out emitted is undone there), and only it
        try:
            plan = decide(node, facts)
            if plan is None:
                continue
            if isinstance(plan, Declined):
                records.append(KVCacheRewrite(node.name, kept_because=plan.reason))
            else:
                records.append(carry_out(plan, facts, built))
        except Exception as error:  # noqa: BLE001 - this attention stays as stock has it
            reason = f"internal failure, left as stock leaves it: {type(error).__name__}: {error}"
            warn_or_raise(logger, "xnnfold: kv_cache attention %r %s", node.name, reason)
            records.append(KVCacheRewrite(node.name, kept_because=reason))
    if any(r.rewritten for r in records):
        # one mask (its additive form, its views) computed once, not once per layer; the
        # model's own mask computation, no longer read, erased first: merged into, it would stay
        program.graph.eliminate_dead_code()
        merge_mask_repeats(program.graph, set(program.graph.nodes) - before,
                           grouped.MASK_VIEW_OPS)
        # the pipeline then tidies (what the merge left dead, lint, recompile, output specs)
    return records


class KVCacheStep:
    """``visible_rows``: see :func:`rewrite_kv_caches`."""

    name = "kv_cache"

    def __init__(self, visible_rows: bool = False):
        self.visible_rows = visible_rows

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(rewrite_kv_caches(program, context.llm_kernels, self.visible_rows))

    def open(self, partitioner):
        """The visible rows where the partitioner's configs can take them (the protocol)."""
        from .visible_config import open_visible_rows
        return open_visible_rows(partitioner, STEP_VISIBLE_ROWS, STEP)

    def summary(self, records: list) -> Optional[str]:
        """Which kernels the lowered program needs, after this step."""
        if not records:
            return None
        custom = sorted({k.strip() for r in records if r.rewritten and r.kernels
                         for k in r.kernels.split(",") if "::" in k})
        if not custom:
            return "kernels the .pte needs: XNNPACK and the portable kernels (any runtime)"
        return (f"kernels the .pte needs: XNNPACK, the portable kernels and executorch's LLM "
                f"custom ops {', '.join(custom)} (a runtime built with them: the wheel's "
                "pybindings, apps linking executorch's custom_ops)")


STEP = KVCacheStep()
# the step of a partitioner whose configs take the attention over the visible rows
# (xnnfold.XnnpackPartitioner, unless executorch's internals are not what it wraps)
STEP_VISIBLE_ROWS = KVCacheStep(visible_rows=True)
