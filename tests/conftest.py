"""The one helper every test uses: lower stock and xnnfold, run both .pte, compare, count."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from xnnfold.steps import runtime_weight
from xnnfold.bench.measure import STOCK, XNNFOLD, Lowered, lower, max_abs_diff, run_pte

torch.set_num_threads(1)   # small shapes; and no OpenMP pool for a forked process to inherit
# Every fold of the suite runs the fast probe and the whole-program probe and fails on any
# disagreement (xnnfold.probe.verified); export XNNFOLD_VERIFY_PROBE=0 to time the fast path alone.
os.environ.setdefault("XNNFOLD_VERIFY_PROBE", "1")

# XNNPACK's serialized graph has a per-tensor entry a little larger than the portable program's
# (measured: +8 to +16 bytes per constant moved into a delegate, whatever its size). A fold that
# stores any tensor twice exceeds this by the tensor's size.
DELEGATE_BYTES_PER_CONSTANT = 16
# A GEMM moved from portable into a delegate costs XNNPACK's node and value entries, whatever
# the tensor sizes (measured for a 2x2 linear: +120 bytes, +248 with a dynamic dim), and at
# most one more delegate call.
DELEGATE_BYTES_PER_GEMM = 384
# An attention the attention step rewrites multiplies q by its scale inside the delegate:
# XNNPACK stores that float as a one-element constant.
ATTENTION_SCALE_BYTES = 4


@dataclass
class Checked:
    stock: Optional[Lowered]          # None where stock cannot lower the program
    folded: Lowered
    stock_diff: float
    folded_diff: float
    ideal: Optional[Lowered] = None

    @property
    def fold(self):
        return self.folded.fold

    def status(self, gemm: str, role: str) -> str:
        return next(o.status for o in self.fold.operands if o.gemm == gemm and o.role == role)

    def statuses(self) -> set:
        return {o.status for o in self.fold.operands}


def check_lowering(model, inputs, *, dynamic_shapes=None, ep=None, reference=None,
                   run_inputs: Optional[list] = None, tol: float = 1e-5,
                   partitioner_kwargs: Optional[dict] = None, ideal=None,
                   stock_run: str = "compare", compare_counts: bool = True,
                   rules=None, stock_if_modified: bool = False) -> Checked:
    """Export (unless ``ep`` is given), lower stock and xnnfold, run both on the runtime.

    Asserts what holds for *every* program: the xnnfold .pte matches eager within ``tol``, and
    it never stores more tensor bytes, never has more .pte bytes (but for the per-constant
    overhead of XNNPACK's format), delegate calls or GEMMs outside delegates than stock. Returns the
    two lowerings for the test's own assertions. ``run_inputs`` are extra input tuples (other
    dynamic sizes) to run both programs on. ``ideal`` is a hand rewrite of the model with
    plain params: where given, it is lowered with stock too, and it also bounds the bytes (XNNPACK
    stores a conv weight in more bytes than the portable program does, and a delegate where
    stock has none costs a call). ``stock_run``: "compare" (default) runs the stock .pte too;
    "raises" expects it to fail to run (XNNPACK rejects it at init); "skip" does not run it
    (it aborts the process, which no test can catch); "fails_to_lower" expects stock's lowering
    itself to raise (an op outside the Core ATen opset that xnnfold folds away): only the xnnfold
    .pte is run and compared, and ``stock`` is None. ``compare_counts=False`` leaves the
    byte and count comparisons to the caller (the property test states its own). ``rules``:
    the xnnfold.rules.RuleSet xnnfold lowers with (tests of a rule pass one without it).
    ``stock_if_modified``: lower stock only if xnnfold changed the program; if it did not, the
    xnnfold lowering *is* the stock one (the program handed to the stock partitioner's logic is
    ``ep``, with no GEMM marked), so only the xnnfold .pte is run and ``stock`` is None.
    """
    if ep is None:
        ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    if stock_run == "fails_to_lower":
        assert not (run_inputs or reference or ideal), "fails_to_lower checks the inputs only"
        return _check_where_stock_cannot_lower(model, ep, inputs, tol, partitioner_kwargs)
    folded = lower(ep, XNNFOLD, {**(partitioner_kwargs or {}),
                                 **({"rules": rules} if rules is not None else {})})
    if stock_if_modified and not folded.fold.modified:
        assert not any(map(runtime_weight.is_marked, folded.fold.program.graph.nodes))
        return _check_xnnfold_alone(model, folded, inputs, run_inputs, tol)
    stock = lower(ep, STOCK, partitioner_kwargs)
    diffs = {STOCK: 0.0, XNNFOLD: 0.0}
    for args in [inputs] + list(run_inputs or []):
        with torch.no_grad():
            expected = reference(*args) if reference is not None else model(*args)
        if stock_run == "raises":
            with pytest.raises(RuntimeError):
                run_pte(stock.pte, args)
        for variant, lowered in ((STOCK, stock), (XNNFOLD, folded)):
            if variant == STOCK and stock_run != "compare":
                continue
            diffs[variant] = max(diffs[variant], max_abs_diff(run_pte(lowered.pte, args),
                                                              expected))
    assert diffs[XNNFOLD] <= tol, f"xnnfold .pte differs from eager by {diffs[XNNFOLD]}"
    ideal_lowered = None
    if ideal is not None:
        ideal_ep = torch.export.export(ideal, inputs, dynamic_shapes=dynamic_shapes)
        ideal_lowered = lower(ideal_ep, STOCK, partitioner_kwargs)
        assert max_abs_diff(run_pte(ideal_lowered.pte, inputs), model(*inputs)) <= tol
    assert folded.fold is not None and folded.fold.fallback is None, folded.fold.fallback
    # The naive fold's failure: tensors stored twice. Exact, whatever the format's overhead,
    # but for the one-float scale each rewritten attention's delegate stores (stock keeps it
    # in a mul.Scalar on portable).
    scales = ATTENTION_SCALE_BYTES * sum(a.rewritten for a in folded.fold.attention)
    assert folded.constant_bytes <= stock.constant_bytes + scales, (folded.constant_bytes,
                                                                    stock.constant_bytes)
    if not compare_counts:
        return Checked(stock, folded, diffs[STOCK], diffs[XNNFOLD], ideal_lowered)
    assert len(folded.gemms_outside) <= len(stock.gemms_outside)
    moved = len(stock.gemms_outside) - len(folded.gemms_outside)
    slack = DELEGATE_BYTES_PER_CONSTANT * len(folded.fold.constants) + \
        DELEGATE_BYTES_PER_GEMM * moved
    bound = max(stock.pte_bytes + slack, ideal_lowered.pte_bytes if ideal_lowered else 0)
    assert folded.pte_bytes <= bound, (folded.pte_bytes, stock.pte_bytes, bound)
    max_calls = max(stock.delegate_calls + moved,
                    ideal_lowered.delegate_calls if ideal_lowered else 0)
    assert folded.delegate_calls <= max_calls, (folded.delegate_calls, stock.delegate_calls)
    return Checked(stock, folded, diffs[STOCK], diffs[XNNFOLD], ideal_lowered)


def _check_where_stock_cannot_lower(model, ep, inputs, tol, partitioner_kwargs) -> Checked:
    with pytest.raises(Exception):
        lower(ep, STOCK, partitioner_kwargs)
    return _check_xnnfold_alone(model, lower(ep, XNNFOLD, partitioner_kwargs), inputs, None, tol)


def _check_xnnfold_alone(model, folded, inputs, run_inputs, tol) -> Checked:
    """Run and compare the xnnfold .pte only (``stock`` is None): where stock's lowering
    raises, or where xnnfold's lowering is stock's."""
    assert folded.fold is not None and folded.fold.fallback is None, folded.fold.fallback
    diff = 0.0
    for args in [inputs] + list(run_inputs or []):
        with torch.no_grad():
            diff = max(diff, max_abs_diff(run_pte(folded.pte, args), model(*args)))
    assert diff <= tol, f"xnnfold .pte differs from eager by {diff}"
    return Checked(None, folded, float("nan"), diff)


def assert_all_delegated(checked: Checked, packed_shapes=(), part_shapes=()) -> None:
    """No GEMM and no split outside delegates; delegates hold the parts, not the packed param."""
    folded = checked.folded
    assert folded.gemms_outside == [], folded.ops_outside
    assert folded.splits_outside == [], folded.ops_outside
    held = folded.constant_shapes()
    for shape in packed_shapes:
        assert tuple(shape) not in held, f"a delegate holds the packed param {shape}: {held}"
    for shape in part_shapes:
        assert tuple(shape) in held, f"no delegate holds a part of shape {shape}: {held}"


# The ops MHA's in-projection layout chain leaves on portable (no XNNPACK config in 1.5.1).
LAYOUT_OPS = frozenset({"aten.select_copy.int", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
                        "aten.unsqueeze_copy.default"})


def assert_matches_ideal(checked: Checked) -> None:
    """No more delegate calls and .pte bytes than the ideal, and no layout op left on portable."""
    folded, ideal = checked.folded, checked.ideal
    assert ideal is not None, "pass ideal= to check_lowering"
    assert folded.delegate_calls <= ideal.delegate_calls, (folded.delegate_calls,
                                                           ideal.delegate_calls)
    assert folded.pte_bytes <= ideal.pte_bytes, (folded.pte_bytes, ideal.pte_bytes)
    assert not LAYOUT_OPS & set(folded.ops_outside), folded.ops_outside


class Params(torch.nn.Module):
    """A one-line test module: ``forward(*inputs)`` is ``body(params, *inputs)``, with a
    random param of each given shape (a tuple, or ``(shape, dtype)``)."""

    def __init__(self, body, **shapes):
        super().__init__()
        self.body = body
        for name, shape in shapes.items():
            shape, dtype = shape if isinstance(shape[-1], torch.dtype) else (shape, None)
            self.register_parameter(name, torch.nn.Parameter(torch.randn(shape, dtype=dtype)))

    def forward(self, *inputs):
        return self.body(self, *inputs)


@pytest.fixture
def xnnfold_log(caplog):
    caplog.set_level(logging.WARNING, logger="xnnfold")
    return caplog


def pytest_collection_modifyitems(items):
    """The property shards (the suite's longest tests, 25-35 s each) first: workers start
    with them and the short tests fill in behind, instead of one worker finishing on a long
    shard while the other idles."""
    items.sort(key=lambda item: 0 if "test_generated_programs" in item.nodeid else 1)
