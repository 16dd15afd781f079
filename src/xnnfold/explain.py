"""Explain: for every GEMM weight and bias, delegated as is, folded, or declined and why (and
whether it is delegated with a run-time weight); which attentions were rewritten into ops XNNPACK
takes, and which were kept and why; which GEMMs were rewritten as ``linear``; which packed
projections were split into one linear per part; and which indexing by ``torch.where(mask)`` now
indexes by the mask."""

from __future__ import annotations

from typing import Optional

from torch.export import ExportedProgram

from .partitioner import XnnpackPartitioner, fold_gemm_params

class Explanation(list):
    """The :class:`~xnnfold.result.GemmOperand` rows, plus ``projections`` (each a
    :class:`~xnnfold.steps.projections.PackedProjection`, split or kept), ``canonical`` (each a
    :class:`~xnnfold.steps.canonical.CanonicalRewrite`), ``attention`` (each an
    :class:`~xnnfold.steps.attention.AttentionRewrite`, rewritten or kept), ``mask_index``
    (each a :class:`~xnnfold.steps.mask_index.MaskIndexRewrite`), ``kv_cache`` (each a
    :class:`~xnnfold.steps.kv_cache.KVCacheRewrite`) and ``fallback``."""

    def __init__(self, rows, projections=(), fallback: Optional[str] = None, canonical=(),
                 attention=(), mask_index=(), kv_cache=()):
        super().__init__(rows)
        self.kv_cache = list(kv_cache)
        self.projections = list(projections)
        self.canonical = list(canonical)
        self.attention = list(attention)
        self.mask_index = list(mask_index)
        self.fallback = fallback

    @classmethod
    def of(cls, result) -> "Explanation":
        """The explanation of a :class:`~xnnfold.result.FoldResult`."""
        return cls(result.operands, result.projections, result.fallback, result.canonical,
                   result.attention, result.mask_index, result.kv_cache)


def explain(ep: ExportedProgram, partitioner=None) -> Explanation:
    """What ``fold_gemm_params(ep)`` does, row by GEMM operand.

    Pass the :class:`~xnnfold.XnnpackPartitioner` that lowered ``ep`` to read what that
    lowering decided (its ``last_result``) instead of folding again; otherwise this costs one
    fold. If the fold fell back to stock, the operands it would have folded say so (rule
    "internal").
    """
    result = None
    if isinstance(partitioner, XnnpackPartitioner):
        result = partitioner.result_for(ep)
    if result is None:
        result = fold_gemm_params(ep, partitioner)
    return Explanation.of(result)


def format_explanation(rows: list, fallback: Optional[str] = None, projections=None) -> str:
    """A table of ``rows``; then the packed projections and the fallback, if any.

    ``projections`` and ``fallback`` default to those of an :class:`Explanation`.
    """
    projections = projections if projections is not None else getattr(rows, "projections", [])
    fallback = fallback or getattr(rows, "fallback", None)
    table = [[r.gemm, r.module or "", r.kind, r.role, r.status, r.rule or "",
              r.node or r.constant or "", r.reason or ""] for r in rows]
    text = _columns(["gemm", "module (class)", "kind", "operand", "status", "rule",
                     "node / constant", "reason"], table) if table else "no GEMM"
    for rewrite in getattr(rows, "mask_index", []):
        text += f"\n{rewrite.describe()}"
    cached = getattr(rows, "kv_cache", [])
    for record in cached:
        text += f"\n{record.describe()}"
    if cached:
        text += f"\n{kernels_needed(cached)}"
    for attention in getattr(rows, "attention", []):
        text += f"\n{attention.describe()}"
    for rewrite in getattr(rows, "canonical", []):
        text += f"\n{rewrite.describe()}"
    for site in projections:
        text += f"\n{site.describe()}"
    if fallback:
        text += f"\nxnnfold fell back to stock: {fallback}"
    return text


def kernels_needed(kv_cache: list) -> str:
    """Which kernels the lowered program needs, after the KV-cache step."""
    custom = sorted({k.strip() for r in kv_cache if r.rewritten and r.kernels
                     for k in r.kernels.split(",") if "::" in k})
    if not custom:
        return "kernels the .pte needs: XNNPACK and the portable kernels (any runtime)"
    return (f"kernels the .pte needs: XNNPACK, the portable kernels and executorch's LLM custom "
            f"ops {', '.join(custom)} (a runtime built with them: the wheel's pybindings, apps "
            f"linking executorch's custom_ops)")


def _columns(headers: list, rows: list) -> str:
    """A plain text table, left-aligned, a rule under the headers."""
    cells = [[str(c) for c in row] for row in [headers] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
