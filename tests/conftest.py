"""The one helper every test uses: lower stock and xnnfold, run both .pte, compare, count.

Its failures are typed (:class:`NumericMismatch`, :class:`Fallback`, :class:`StoredMore`, ...,
all AssertionErrors carrying the actual values), so that a negative test expects the one failure
its guard prevents, not a regex that could match the text of some other assertion.
"""

from __future__ import annotations

import enum
import io
import logging
import os
import random
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy
import pytest
import torch
import worker_groups

from xnnfold import XnnpackPartitioner
from xnnfold import config as xnnfold_config
from xnnfold.config import STRICT_ENV, VERIFY_ENV, Config
from xnnfold.errors import StrictFallback
from xnnfold.steps import runtime_weight
from xnnfold.pte import STOCK, XNNFOLD, Comparison, Lowered, PteRunner, compare_outputs, \
    lower, run_pte

torch.set_num_threads(1)   # small shapes; and no OpenMP pool for a forked process to inherit
# What every test runs with (xnnfold.config), unless whoever runs the suite exports otherwise:
# every fold runs the fast probe and the whole-program probe and fails on any disagreement
# (verify_probe; XNNFOLD_VERIFY_PROBE=0 times the fast path alone), and an internal failure
# raises (xnnfold.errors.StrictFallback) instead of falling back to stock (strict; a test that
# expects a fallback is marked ``fallback_expected``). Set per test by _seeded_and_strict: a test
# file, or a module it imports, cannot change them for the tests after it.
SUITE_CONFIG = Config.from_environment({STRICT_ENV: "1", VERIFY_ENV: "1", **os.environ})


# --------------------------------------------------------------------------------------------
# Typed failures: each names what went wrong and carries the values.


class NumericMismatch(AssertionError):
    """A .pte's outputs differ from eager's (beyond tolerance, NaN, shape, dtype, count)."""


class Fallback(AssertionError):
    """xnnfold fell back to stock after an internal failure (or would have, in strict mode)."""


class StoredMore(AssertionError):
    """The xnnfold .pte stores more constant (tensor) bytes than stock's."""


class LargerPte(AssertionError):
    """The xnnfold .pte is larger than stock's, beyond XNNPACK's per-constant overhead."""


class GemmsOutside(AssertionError):
    """More GEMMs left outside delegates than allowed."""


class SplitsOutside(AssertionError):
    """A split of a packed param left outside delegates."""


class DelegateCalls(AssertionError):
    """More delegate calls than stock's (or the ideal's)."""


class UnexpectedFold(AssertionError):
    """The fold's record (statuses, rules, rewrites) is not what the case expects."""


class UsersPathDiffers(AssertionError):
    """The fold with verification off (users' path) differs from the verified one."""


class InvalidProgram(AssertionError):
    """The fold's program fails ``validate()`` or a ``torch.export.save`` / ``load`` round trip
    that the input program passes."""


def expect(condition, failure: type, message) -> None:
    """``assert`` with a failure type: pytest's assertion rewriting cannot put the text of
    the expected value into the message a negative test matches."""
    if not condition:
        raise failure(message)


def expect_fold(actual, expected, what: str = "fold") -> None:
    """The fold's record is ``expected``; else :class:`UnexpectedFold`, whose ``actual`` a
    negative test checks (its message also shows the expected value)."""
    if actual != expected:
        failure = UnexpectedFold(f"{what}: got {actual!r}, expected {expected!r}")
        failure.actual = actual
        raise failure


# --------------------------------------------------------------------------------------------
# Seeds: every test, and every module-scoped fixture, draws from a seed of its own.


def seed_everything(key: str) -> int:
    """Seed torch, random and numpy from ``key`` (a test's nodeid, a fixture's name)."""
    seed = zlib.crc32(key.encode())
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)
    return seed


@pytest.fixture(autouse=True)
def _seeded_and_strict(request, monkeypatch):
    """Per test: its own seed, whatever ran before it on this worker; the suite's settings,
    strict unless the test expects a fallback. (Module-scoped fixtures run before this: they
    seed themselves.)"""
    seed_everything(request.node.nodeid)
    fallback = request.node.get_closest_marker("fallback_expected") is not None
    monkeypatch.setattr(xnnfold_config, "DEFAULT", Config(
        strict=SUITE_CONFIG.strict and not fallback, verify_probe=SUITE_CONFIG.verify_probe))


def set_strict(monkeypatch, strict: bool) -> None:
    """Strict mode (a give-up raises) or the users' mode (it warns) for this test."""
    monkeypatch.setattr(xnnfold_config, "DEFAULT",
                        Config(strict, xnnfold_config.DEFAULT.verify_probe))


def pytest_configure(config):
    worker_groups.start(config)
    config.addinivalue_line("markers", f"slow: left out of make test (run with {SLOW_ENV}=1, "
                                       "make test-all)")
    config.addinivalue_line("markers", "fallback_expected: the test expects xnnfold to fall "
                                       "back to stock (strict mode off)")


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
# A tanh GELU the gelu_tanh step writes out keeps its four scalars (0.5, 1, sqrt(2/pi), 0.044715)
# as one-element constants of the delegate.
GELU_TANH_SCALAR_BYTES = 16


@dataclass
class Checked:
    stock: Optional[Lowered]          # None where stock cannot lower the program
    folded: Lowered
    stock_diff: float                 # max abs diff from eager (nan where not run)
    folded_diff: float
    ideal: Optional[Lowered] = None

    @property
    def fold(self):
        return self.folded.fold

    def status(self, gemm: str, role: str) -> str:
        return next(o.status for o in self.fold.operands if o.gemm == gemm and o.role == role)

    def statuses(self) -> set:
        return {o.status for o in self.fold.operands}


class StockPte(enum.Enum):
    """What stock's .pte of the program does when run (stock's lowering succeeds)."""
    RUNS = "runs, and its outputs are compared with eager too"
    FAILS_AT_INIT = "raises at load: XNNPACK rejects it at init"
    NOT_RUN = "not run: it aborts the process, which no test can catch"


@dataclass(frozen=True)
class Tolerance:
    """``compare_outputs``'s ``atol`` and ``rtol`` (None: its per-dtype default)."""
    atol: Optional[float] = None
    rtol: Optional[float] = None

    def compare(self, actual, expected) -> Comparison:
        return compare_outputs(actual, expected, atol=self.atol, rtol=self.rtol)


@dataclass
class Subject:
    """What a check lowers and what it compares with: the program, the eager computation of
    the expected outputs, the input sets, the tolerance and each partitioner's arguments."""
    model: object
    ep: object
    inputs: tuple
    run_inputs: list
    tolerance: Tolerance
    xnnfold_kwargs: dict
    stock_kwargs: Optional[dict] = None
    reference: object = None            # computes the expected outputs in place of ``model``
    dynamic_shapes: object = None

    @classmethod
    def of(cls, model, inputs, *, ep=None, dynamic_shapes=None, run_inputs=None, tol=None,
           rtol=None, partitioner_kwargs=None, rules=None, reference=None) -> "Subject":
        if ep is None:
            ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
        xnnfold_kwargs = {**(partitioner_kwargs or {}),
                          **({"rules": rules} if rules is not None else {})}
        return cls(model, ep, inputs, list(run_inputs or []), Tolerance(tol, rtol),
                   xnnfold_kwargs, partitioner_kwargs, reference, dynamic_shapes)

    @property
    def input_sets(self) -> list:
        return [self.inputs] + self.run_inputs

    def expected(self, args):
        with torch.no_grad():
            return (self.reference if self.reference is not None else self.model)(*args)

    def compare(self, pte: bytes, args) -> Comparison:
        return self.tolerance.compare(run_pte(pte, args), self.expected(args))


def check_lowering(model, inputs, *, ep=None, dynamic_shapes=None,
                   run_inputs: Optional[list] = None, reference=None,
                   tol: Optional[float] = None, rtol: Optional[float] = None,
                   partitioner_kwargs: Optional[dict] = None, rules=None, ideal=None,
                   stock_pte: StockPte = StockPte.RUNS, compare_counts: bool = True) -> Checked:
    """Export (unless ``ep`` is given), lower stock and xnnfold, run both on the runtime.

    Asserts what holds for *every* program: xnnfold did not fall back (:class:`Fallback`), the
    xnnfold .pte matches eager (:class:`NumericMismatch`; :func:`compare_outputs`, ``tol`` is
    its ``atol`` and ``rtol`` its ``rtol``, each defaulting per dtype), the fold with
    verification off (users' path) folds the same (:class:`UsersPathDiffers`), and it never
    stores more tensor bytes (:class:`StoredMore`), never has more .pte bytes (but for the
    per-constant overhead of XNNPACK's format; :class:`LargerPte`), delegate calls
    (:class:`DelegateCalls`) or GEMMs outside delegates (:class:`GemmsOutside`) than stock.
    Returns the two lowerings for the test's own assertions.

    ``run_inputs`` are extra input tuples (other dynamic sizes) to run both programs on;
    ``reference`` computes the expected outputs in place of ``model``. ``ideal`` is a hand
    rewrite of the model with plain params: where given, it is lowered with stock too, and it
    also bounds the bytes (XNNPACK stores a conv weight in more bytes than the portable program
    does, and a delegate where stock has none costs a call). ``stock_pte``: what stock's .pte
    does when run (:class:`StockPte`). ``compare_counts=False`` leaves the byte and count
    comparisons to the caller (the property test states its own). ``rules``: the
    xnnfold.steps.fold.rules.RuleSet xnnfold lowers with (tests of a rule pass one without it).
    Where stock cannot lower the program, see :func:`check_where_stock_fails_to_lower`; where
    xnnfold may leave it as it is, :func:`check_lowering_if_modified`; a stateful program run
    over steps, :func:`check_steps`.
    """
    subject = Subject.of(model, inputs, ep=ep, dynamic_shapes=dynamic_shapes,
                         run_inputs=run_inputs, tol=tol, rtol=rtol,
                         partitioner_kwargs=partitioner_kwargs, rules=rules, reference=reference)
    folded = _lower_xnnfold(subject)
    return _check_against_stock(subject, folded, lower(subject.ep, STOCK, partitioner_kwargs),
                                ideal, stock_pte, compare_counts)


# Why stock cannot lower a program, as its error says it (check_where_stock_fails_to_lower).
NOT_CORE_ATEN = "is not in Core ATen opset"          # an op outside the Core ATen opset
PASS_THROUGH = "is already in the inputs"            # a delegate returning one of its inputs


def check_where_stock_fails_to_lower(model, inputs, *, stock_error: str, dynamic_shapes=None,
                                     tol: Optional[float] = None) -> Checked:
    """Stock's lowering raises, with ``stock_error`` (a regex) in its message: expect that, and
    run and compare the xnnfold .pte only (``stock`` is None)."""
    subject = Subject.of(model, inputs, dynamic_shapes=dynamic_shapes, tol=tol)
    with pytest.raises(Exception, match=stock_error):
        lower(subject.ep, STOCK)
    return _check_xnnfold_alone(subject, _lower_xnnfold(subject))


def check_lowering_if_modified(model, inputs, *, dynamic_shapes=None,
                               run_inputs: Optional[list] = None, tol: Optional[float] = None,
                               partitioner_kwargs: Optional[dict] = None,
                               compare_counts: bool = True) -> Checked:
    """:func:`check_lowering`, but stock is lowered only if xnnfold changed the program: if it
    did not, the xnnfold lowering *is* the stock one (the program handed to the stock
    partitioner's logic is ``ep``, with no GEMM marked), so only the xnnfold .pte is run and
    ``stock`` is None."""
    subject = Subject.of(model, inputs, dynamic_shapes=dynamic_shapes, run_inputs=run_inputs,
                         tol=tol, partitioner_kwargs=partitioner_kwargs)
    folded = _lower_xnnfold(subject)
    if not folded.fold.modified:
        assert not any(map(runtime_weight.is_marked, folded.fold.program.graph.nodes))
        return _check_xnnfold_alone(subject, folded)
    return _check_against_stock(subject, folded, lower(subject.ep, STOCK, partitioner_kwargs),
                                None, StockPte.RUNS, compare_counts)


def check_steps(program, steps: list, reference, *, tol: Optional[float] = None,
                partitioner_kwargs: Optional[dict] = None, compare_counts: bool = True) -> Checked:
    """:func:`check_lowering` of a stateful ``program`` (a KV cache): the input tuples
    ``steps`` run *in order* on one loaded program per lowering, against ``reference`` called
    in the same order once."""
    subject = Subject(None, program, steps[0], [], Tolerance(tol),
                      dict(partitioner_kwargs or {}), partitioner_kwargs, reference)
    with torch.no_grad():
        expected = [reference(*args) for args in steps]
    # stock first, as users compare: xnnfold must lower a program stock has lowered before
    stock = lower(program, STOCK, partitioner_kwargs)
    folded = _lower_xnnfold(subject)
    verdicts = []
    for lowered in (stock, folded):
        runner = PteRunner(lowered.pte)
        verdict = Comparison(True)
        for args, want in zip(steps, expected):
            verdict = verdict.worst(subject.tolerance.compare(runner.run(args), want))
        verdicts.append(verdict)
    _expect_matches(verdicts[1], "xnnfold")
    _expect_users_path(subject, folded)
    _expect_stores_no_more(folded, stock)
    if compare_counts:
        _expect_no_worse_than_stock(folded, stock, None)
    return Checked(stock, folded, verdicts[0].max_abs_diff, verdicts[1].max_abs_diff)


def _check_against_stock(subject: Subject, folded: Lowered, stock: Lowered, ideal,
                         stock_pte: StockPte, compare_counts: bool) -> Checked:
    """Both lowerings run and compared; the ideal's, if any; the users' path; no worse than
    stock."""
    stock_verdict, folded_verdict = Comparison(True), Comparison(True)
    for args in subject.input_sets:
        if stock_pte is StockPte.FAILS_AT_INIT:
            with pytest.raises(RuntimeError):
                run_pte(stock.pte, args)
        elif stock_pte is StockPte.RUNS:
            stock_verdict = stock_verdict.worst(subject.compare(stock.pte, args))
        folded_verdict = folded_verdict.worst(subject.compare(folded.pte, args))
    _expect_matches(folded_verdict, "xnnfold")
    ideal_lowered = _check_ideal(subject, ideal) if ideal is not None else None
    _expect_users_path(subject, folded)
    _expect_stores_no_more(folded, stock)
    if compare_counts:
        _expect_no_worse_than_stock(folded, stock, ideal_lowered)
    return Checked(stock, folded, stock_verdict.max_abs_diff, folded_verdict.max_abs_diff,
                   ideal_lowered)


def _check_ideal(subject: Subject, ideal) -> Lowered:
    """The hand rewrite lowered with stock, its .pte checked against the model's eager."""
    ideal_ep = torch.export.export(ideal, subject.inputs, dynamic_shapes=subject.dynamic_shapes)
    ideal_lowered = lower(ideal_ep, STOCK, subject.stock_kwargs)
    _expect_matches(subject.tolerance.compare(run_pte(ideal_lowered.pte, subject.inputs),
                                              subject.expected(subject.inputs)),
                    "the ideal rewrite's")
    return ideal_lowered


def _expect_stores_no_more(folded: Lowered, stock: Lowered) -> None:
    """The naive fold's failure: tensors stored twice. Exact, whatever the format's overhead,
    but for the one-float scale each rewritten attention's delegate stores (stock keeps it in a
    mul.Scalar on portable)."""
    scales = ATTENTION_SCALE_BYTES * (sum(a.rewritten for a in folded.fold.of("attention")) +
                                      sum(c.rewritten for c in folded.fold.of("kv_cache"))) + \
        GELU_TANH_SCALAR_BYTES * sum(g.rewritten for g in folded.fold.of("gelu_tanh"))
    expect(folded.constant_bytes <= stock.constant_bytes + scales, StoredMore,
           f"xnnfold stores {folded.constant_bytes:,} constant bytes, stock "
           f"{stock.constant_bytes:,} (+{scales} for attention and GELU scalars)")


def _expect_no_worse_than_stock(folded: Lowered, stock: Lowered,
                                ideal: Optional[Lowered]) -> None:
    """No more GEMMs outside, .pte bytes (but XNNPACK's per-constant and per-GEMM overhead, or
    the ideal's bytes) and delegate calls (but one per GEMM moved in, or the ideal's) than
    stock."""
    expect(len(folded.gemms_outside) <= len(stock.gemms_outside), GemmsOutside,
           f"GEMMs outside delegates: xnnfold {folded.gemms_outside}, stock "
           f"{stock.gemms_outside}")
    moved = len(stock.gemms_outside) - len(folded.gemms_outside)
    slack = DELEGATE_BYTES_PER_CONSTANT * len(folded.fold.constants) + \
        DELEGATE_BYTES_PER_GEMM * moved
    bound = max(stock.pte_bytes + slack, ideal.pte_bytes if ideal else 0)
    expect(folded.pte_bytes <= bound, LargerPte,
           f"xnnfold .pte {folded.pte_bytes:,} bytes, stock {stock.pte_bytes:,}, bound {bound:,}")
    max_calls = max(stock.delegate_calls + moved, ideal.delegate_calls if ideal else 0)
    expect(folded.delegate_calls <= max_calls, DelegateCalls,
           f"xnnfold {folded.delegate_calls} delegate calls, stock {stock.delegate_calls}, "
           f"bound {max_calls}")


def _lower_xnnfold(subject: Subject) -> Lowered:
    """Lower with xnnfold; a fallback (or, in strict mode, the error raised in its place) is a
    :class:`Fallback`."""
    try:
        folded = lower(subject.ep, XNNFOLD, subject.xnnfold_kwargs)
    except StrictFallback as error:
        raise Fallback(str(error)) from error
    expect(folded.fold is not None, Fallback, "xnnfold's hook did not run")
    expect(folded.fold.fallback is None, Fallback, f"xnnfold fell back: {folded.fold.fallback}")
    return folded


def _expect_matches(verdict: Comparison, whose: str) -> None:
    expect(verdict.ok, NumericMismatch, f"{whose} .pte differs from eager: {verdict.reason}")


def fold_record(result) -> tuple:
    """What a fold decided, comparable between two runs of it."""
    return ([(o.gemm, o.role, o.status, o.rule, o.delegated, o.runtime_weight)
             for o in result.operands],
            sorted((c.name, tuple(c.shape), c.dtype, tuple(c.consumers)) for c in result.constants),
            [(c.node, c.kernels, c.kept_because) for c in result.of("kv_cache")])


def _expect_users_path(subject: Subject, folded: Lowered) -> None:
    """The users' path: the fold alone, verification off (fast-probe failures would be
    swallowed there; strict mode raises them), must decide what the verified lowering did.
    Only the fold runs, not a second lowering."""
    partitioner = XnnpackPartitioner(**subject.xnnfold_kwargs, config=Config(
        strict=xnnfold_config.current().strict, verify_probe=False))
    try:
        unverified = partitioner.fold(subject.ep)
    except StrictFallback as error:
        raise Fallback(f"with verification off: {error}") from error
    expect(unverified.fallback is None, Fallback,
           f"with verification off, xnnfold fell back: {unverified.fallback}")
    expect(fold_record(unverified) == fold_record(folded.fold), UsersPathDiffers,
           f"verification off: {fold_record(unverified)}; on: {fold_record(folded.fold)}")
    expect_valid(subject.ep, unverified.program)


def round_trip(program):
    """``program`` saved with ``torch.export.save`` and loaded back."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


def expect_valid(ep, program) -> None:
    """The fold's ``program`` passes torch's checker and round-trips through save / load, as
    the fold-as-a-pass road needs (:class:`InvalidProgram`), unless the input ``ep`` itself
    does not."""
    if program is ep:
        return
    try:
        program.validate()
        round_trip(program)
    except Exception as error:  # noqa: BLE001 - compared with the input's own round trip
        try:
            round_trip(ep)
        except Exception:  # noqa: BLE001 - torch cannot save the input: not the fold's doing
            return
        raise InvalidProgram(f"the folded program: {type(error).__name__}: {error}") from error


def _check_xnnfold_alone(subject: Subject, folded: Lowered) -> Checked:
    """Run and compare the xnnfold .pte only (``stock`` is None): where stock's lowering
    raises, or where xnnfold's lowering is stock's."""
    verdict = Comparison(True)
    for args in subject.input_sets:
        verdict = verdict.worst(subject.compare(folded.pte, args))
    _expect_matches(verdict, "xnnfold")
    _expect_users_path(subject, folded)
    return Checked(None, folded, float("nan"), verdict.max_abs_diff)


def assert_all_delegated(checked: Checked, packed_shapes=(), part_shapes=()) -> None:
    """No GEMM and no split outside delegates; delegates hold the parts, not the packed param."""
    folded = checked.folded
    expect(folded.gemms_outside == [], GemmsOutside,
           f"GEMMs outside delegates: {folded.gemms_outside} (all ops outside: "
           f"{folded.ops_outside})")
    expect(folded.splits_outside == [], SplitsOutside,
           f"splits outside delegates: {folded.splits_outside} (all ops outside: "
           f"{folded.ops_outside})")
    held = folded.constant_shapes()
    for shape in packed_shapes:
        expect(tuple(shape) not in held, UnexpectedFold,
               f"a delegate holds the packed param {shape}: {held}")
    for shape in part_shapes:
        expect(tuple(shape) in held, UnexpectedFold,
               f"no delegate holds a part of shape {shape}: {held}")


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


class Sdpa(torch.nn.Module):
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)`` as a module."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                **self.kwargs)


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


# ``make test`` leaves out the tests marked ``slow`` (more architectures and quantization modes
# of what a test beside them already checks, the property test's second half) to stay under 15
# minutes on 2 cores; ``make test-all`` (XNNFOLD_SLOW_TESTS=1) runs them too.
SLOW_ENV = "XNNFOLD_SLOW_TESTS"


def pytest_collection_modifyitems(config, items):
    """Leave out the slow set unless asked; the property shards (the suite's longest tests,
    25-35 s each) first: workers start with them and the short tests fill in behind, instead
    of one worker finishing on a long shard while the other idles. Tests that share a
    module-scoped fixture go to one worker (``worker_groups``)."""
    if os.environ.get(SLOW_ENV) != "1":
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    items.sort(key=lambda item: 0 if "test_generated_programs" in item.nodeid else 1)
    worker_groups.write(items)


def pytest_xdist_make_scheduler(config, log):
    return worker_groups.make_scheduler(config, log)


def tiny_wav2vec2_config(transformers, layers: int):
    """transformers' Wav2Vec2 at toy dims (a weight_norm positional conv, strided feature convs):
    third-party code that meets dynamic lengths."""
    return transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2)


# --------------------------------------------------------------------------------------------
# A skipped test is a test of a shipped feature that did not run: the run fails (its
# dependencies are test requirements, installed by make test).

_SKIPPED: list = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        _SKIPPED.append(f"{report.nodeid}: {why}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"{len(_SKIPPED)} test(s) skipped, which fails the run: "
                                + "; ".join(_SKIPPED[:5]), red=True)
