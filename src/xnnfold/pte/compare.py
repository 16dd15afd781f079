"""The one comparison of a .pte's outputs with eager's, for the tests and the report.

``compare_outputs(actual, expected)`` passes where every element satisfies
``|a - e| <= atol + rtol * |e|`` (the scaled tolerance of ``torch.testing.assert_close``);
``per_row=True`` judges each element against its row's scale instead, ``|a - e| <= atol + rtol
* max |e| over the last dim`` (an LM's logits: each is a dot product with the same hidden state,
so its rounding follows the row's magnitude, and a logit near 0 is as far off as a large one:
a per-element relative tolerance calls a correct export wrong there). Both fail, with the reason,
on what a maximum of differences hides: a NaN or inf where eager has a finite value, a missing or
extra output, a shape or dtype mismatch. ``max(0.0, nan)`` is 0.0, and a (1,) output broadcast
against a (4,) reference differs by nothing: neither passes here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils import _pytree as pytree

# Default (rtol, atol) per dtype of the expected output. fp32: XNNPACK sums in another order
# than eager's kernels, and an absolute 1e-5 is under 3 ulp at outputs near 40 (stock's own .pte
# exceeded it in 2 of 40 random states of one test case); a relative 1e-4 scales with the
# values. Half types: torch.testing's defaults. Integers and bools must be exact.
DEFAULT_TOLERANCE = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


# Default rtol per dtype with per_row=True: a share of the row's largest |value|. fp32, measured
# (xnnfold bench llm-families, 2026-12-05): correct exports of transformers LMs 1e-6 to 7e-6
# (Llama 2.9e-6, Gemma 6.9e-6 at hidden 512, 4 layers, 64 greedy tokens), a .pte whose GELU
# computes another approximation in every layer 2e-4 to 5e-4 (stock's Gemma), a cache that is
# not read 1e-1 and more; the default sits between, over 10x from each.
ROW_TOLERANCE = {
    torch.float32: 1e-4,
    torch.float64: 1e-10,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


# A PT2E int8 model's .pte against its converted module in eager: XNNPACK computes in int8
# where eager simulates the quantization in fp32 (dynamic: it quantizes each activation per
# call), so outputs differ by some quantization steps, carried through the layers: an absolute
# tolerance of this share of the largest |output|. Measured, stock's own .pte (xnnfold's is
# the same): dynamic 0.7-0.9% (the report's models, a TransformerDecoderLayer; 2026-12-05);
# static, transformers from configs (xnnfold bench quantized-attention, 2026-12-05): ViT 5.5%,
# wav2vec2 4.1%, Whisper encoder 1.6%, BERT 1.6%. A wrong value (rows, scales or parts mixed
# up) is off by about the output's range.
QUANTIZED_ATOL_SHARE = 0.1


def quantized_tolerance(expected) -> dict:
    """``compare_outputs``' ``rtol``/``atol`` for a PT2E-quantized model's outputs."""
    largest = max((float(t.detach().abs().max()) for t in _flat(expected)
                   if t.numel() and t.is_floating_point()), default=0.0)
    return {"atol": QUANTIZED_ATOL_SHARE * largest}


# A quantized LM's logits against its quantized eager model's, at any depth: eager's own
# sensitivity to rounding is measured, not assumed. ``spread`` is eager's logits again with each
# activation entering a quantized linear moved by a relative SPREAD_NUDGE (a fortieth of an
# 8-bit quantum at a token's largest value: some activations round to the neighbouring quantum,
# as in kernels that round otherwise). Measured (random N(0, 0.02) weights at SmolLM2-135M's
# widths, 1, 2, 4 and 30 layers, 2026-12-06): xnnfold's and stock's .pte (the same logits)
# 0.94-1.24x that spread in the largest difference and the rows' relative RMS; a broken .pte
# 2.9x and more (each decode step a cache row further or overwriting the previous token's:
# 7.7-22x at 1-4 layers, 2.9-3.4x at 30, where random layers dilute one row; a layer dropped
# 9x and more; the cache not read 46x and more); the verdict passes within SPREAD_FACTOR
# times it, between the two.
SPREAD_NUDGE = 1e-4
SPREAD_FACTOR = 2.0


def _row_rms(d: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Each row's RMS of ``d`` over the RMS of ``e``'s row about its mean."""
    return d.norm(dim=-1) / (e - e.mean(-1, keepdim=True)).norm(dim=-1).clamp_min(1e-30)


def compare_to_spread(actual: torch.Tensor, expected: torch.Tensor,
                      spread: torch.Tensor) -> Comparison:
    """Rows of logits (R, V) of a quantized .pte against eager's, judged against eager's own
    spread (:data:`SPREAD_NUDGE`): the largest difference and every row's relative RMS each
    within :data:`SPREAD_FACTOR` times eager's; the greedy tokens' agreement reported."""
    a, e, s = (t.detach().double().reshape(-1, t.shape[-1]) for t in (actual, expected, spread))
    floor = ROW_TOLERANCE[torch.float32] * float(e.abs().max())      # fp32 rounding at least
    largest = max(float((s - e).abs().max()), floor, 1e-30)     # all-zero logits: no 0/0
    verdict = _compare_one(0, actual, expected, 0.0, SPREAD_FACTOR * largest)
    if verdict.reason is not None and "beyond" not in verdict.reason:
        return verdict                      # not comparable: shape, dtype, NaN or inf
    rms, spread_rms = float(_row_rms(a - e, e).max()), float(_row_rms(s - e, e).max())
    spread_rms = max(spread_rms, ROW_TOLERANCE[torch.float32])
    top = e.topk(2, dim=-1).values
    mine = a.argmax(-1)
    differ = mine != e.argmax(-1)
    lead = float((top[:, 0] - e.gather(1, mine[:, None])[:, 0])[differ].max()) \
        if bool(differ.any()) else 0.0
    tokens = (f"greedy tokens equal eager's in {int((~differ).sum())} of {len(mine)}" + (
        f", eager's best leading the others by at most {lead:.3g}" if lead else ""))
    said = (f"{verdict.max_abs_diff / largest:.2g}x eager's own spread {largest:.3g}; a row's "
            f"relative RMS {rms:.3g}, {rms / spread_rms:.2g}x eager's {spread_rms:.3g} (eager "
            f"with its quantized linears' inputs moved by a relative {SPREAD_NUDGE:g}); {tokens}")
    if verdict.max_abs_diff > SPREAD_FACTOR * largest or rms > SPREAD_FACTOR * spread_rms:
        return Comparison(False, verdict.max_abs_diff, verdict.max_rel_diff,
                          f"output 0: beyond {SPREAD_FACTOR:g}x eager's own spread: max abs "
                          f"diff {verdict.max_abs_diff:.3g}, {said}")
    return Comparison(True, verdict.max_abs_diff, verdict.max_rel_diff, note=said)


def default_tolerance(dtype: torch.dtype) -> tuple:
    """(rtol, atol) for outputs of ``dtype``: see DEFAULT_TOLERANCE; exact for the others."""
    return DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))


@dataclass
class Comparison:
    """The verdict on one set of outputs: ``ok``, the largest differences, and why not ok."""

    ok: bool
    max_abs_diff: float = 0.0        # over elements where eager is finite; nan if not comparable
    max_rel_diff: float = 0.0        # |a - e| / |e| where e != 0 (per_row: / the row's max |e|)
    reason: Optional[str] = None     # set when not ok
    note: Optional[str] = None       # what else an ok verdict measured (compare_to_spread)

    def __str__(self) -> str:
        if self.ok:
            return f"max abs diff {self.max_abs_diff:.1e}" + (f" ({self.note})" if self.note
                                                               else "")
        return f"WRONG: {self.reason}"

    def worst(self, other: "Comparison") -> "Comparison":
        """The first failure of the two, else the larger differences (several input sets)."""
        if not self.ok:
            return self
        if not other.ok:
            return other
        return Comparison(True, max(self.max_abs_diff, other.max_abs_diff),
                          max(self.max_rel_diff, other.max_rel_diff))


def _flat(outputs) -> list:
    """The tensors of a (nested) output, in order; None leaves (an MHA's weights) dropped,
    Python numbers as 0-dim tensors."""
    leaves = pytree.tree_leaves(outputs)
    return [leaf if isinstance(leaf, torch.Tensor) else torch.tensor(leaf)
            for leaf in leaves if leaf is not None]


def _shape(t: torch.Tensor) -> str:
    return "(" + ",".join(str(s) for s in t.shape) + ("," if t.dim() == 1 else "") + ")"


def _row_scale(e64: torch.Tensor) -> torch.Tensor:
    """Each element's row's largest finite |value| (the last dim), in ``e64``'s shape."""
    finite = e64.abs().masked_fill(~torch.isfinite(e64), 0.0)
    if finite.dim() == 0:
        return finite
    return finite.amax(-1, keepdim=True).expand_as(finite)


def _compare_one(index: int, a: torch.Tensor, e: torch.Tensor, rtol: Optional[float],
                 atol: Optional[float], per_row: bool = False) -> Comparison:
    where = f"output {index}: "
    if tuple(a.shape) != tuple(e.shape):
        return Comparison(False, math.nan, math.nan, f"{where}shape {_shape(a)} vs {_shape(e)}")
    if a.dtype != e.dtype:
        return Comparison(False, math.nan, math.nan, f"{where}dtype {a.dtype} vs {e.dtype}")
    d_rtol, d_atol = default_tolerance(e.dtype)
    if per_row:
        d_rtol = ROW_TOLERANCE.get(e.dtype, 0.0)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if a.numel() == 0:
        return Comparison(True)
    a64, e64 = a.detach().double(), e.detach().double()
    finite = torch.isfinite(e64)
    # Where eager is NaN or inf, the .pte must give the same (NaN where NaN, inf of that sign).
    special = ~finite
    if special.any():
        same = (a64[special] == e64[special]) | (a64[special].isnan() & e64[special].isnan())
        if not bool(same.all()):
            bad = int((~same).sum())
            return Comparison(False, math.nan, math.nan,
                              f"{where}{bad} element(s) differ where eager is NaN or inf")
    diff = (a64[finite] - e64[finite]).abs()
    if diff.numel() == 0:
        return Comparison(True)
    not_finite = int((~torch.isfinite(a64[finite])).sum())
    if not_finite:
        return Comparison(False, math.nan, math.nan,
                          f"{where}{not_finite} NaN/inf element(s) where eager is finite")
    ref = _row_scale(e64)[finite] if per_row else e64[finite].abs()
    max_abs = float(diff.max())
    nonzero = ref > 0
    max_rel = float((diff[nonzero] / ref[nonzero]).max()) if bool(nonzero.any()) else 0.0
    excess = diff - (atol + rtol * ref)
    if bool((excess > 0).any()):
        i = int(excess.argmax())
        scale = "the row's largest |expected|" if per_row else "|expected|"
        relative = "max of the row's scale" if per_row else "max rel"
        return Comparison(False, max_abs, max_rel,
                          f"{where}max abs diff {max_abs:.3g} ({relative} {max_rel:.3g}) beyond "
                          f"atol {atol:g} + rtol {rtol:g} * {scale} (worst element: "
                          f"{float(a64[finite][i]):.6g} vs {float(e64[finite][i]):.6g})")
    return Comparison(True, max_abs, max_rel)


def compare_outputs(actual, expected, rtol: Optional[float] = None,
                    atol: Optional[float] = None, per_row: bool = False) -> Comparison:
    """Compare a .pte's outputs (the runtime's list) with eager's (a tensor or a nested
    structure of them). ``rtol``/``atol`` default per dtype (:func:`default_tolerance`;
    ``per_row``: ``rtol`` is a share of each row's largest |value|, :data:`ROW_TOLERANCE`)."""
    got, want = _flat(actual), _flat(expected)
    if len(got) != len(want):
        return Comparison(False, math.nan, math.nan,
                          f"{len(got)} output(s) vs eager's {len(want)}")
    result = Comparison(True)
    for index, (a, e) in enumerate(zip(got, want)):
        result = result.worst(_compare_one(index, a, e, rtol, atol, per_row))
        if not result.ok:
            return result
    return result
