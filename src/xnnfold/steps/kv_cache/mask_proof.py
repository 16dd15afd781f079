"""The mask an attention over a KV cache reads, proven on the program itself.

:func:`prove_mask` evaluates the mask's computation (:class:`.positions.MaskFunction`), which
must depend on the start ``P`` (and on the step's length ``L``) alone, and on constants, for
*every* start ``P`` the update accepts (``0 .. S - L``: eager's ``index_copy_`` raises on any
other) and, for a dynamic length, for every ``L`` its bounds allow; and says what it is: the
causal mask from ``P`` (row ``l`` attends exactly the cache rows ``0 .. P + l``), that mask
within a sliding window (``P + l - W + 1 .. P + l``: transformers' sliding-window layers, whose
static cache keeps all S rows and blocks the older ones by the mask alone), or a mask without a
fully blocked row. That is a proof by exhaustion, not a pattern: it holds whatever ops build
the mask. The starts of one length are evaluated together (``torch.vmap``; one by one where an
op of the mask has no batching rule, within :data:`LOOP_BUDGET`).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.fx

from ...graph.node_meta import tensor_val
from ...graph.values import ValueNumbers
from . import positions
from .plan import ATTENDS, CAUSAL, Declined, MaskKind, Proof
from .positions import MaskFunction

# Evaluations of the mask one start at a time, at most, where torch.vmap cannot batch them (a
# few seconds): beyond, the mask is not proven.
LOOP_BUDGET = 20_000
# Mask elements evaluated at most (every row of every start of every length, per head): a shared
# mask of steps of 1 to 128 rows over 1,024 cache rows is 7.9e9 (tens of seconds); a per-head
# mask has as many more as heads. Beyond, the mask is not proven (rows fully blocked are then
# handled by a keep factor: a few ops on the mask's own size per step).
ELEMENT_BUDGET = 2 ** 33
# Mask elements evaluated and compared at once (a batch of starts of one length): memory reused
# from batch to batch rather than one tensor of every start, 117 MB fresh pages for each length
# of a step of 128 rows over 1,024 cache rows.
BATCH_ELEMENTS = 2 ** 24


def prove_mask(mask: torch.fx.Node, start: torch.fx.Node, rows, cache: int,
               static_values: dict, written: set, numbers: ValueNumbers
               ) -> Union[Proof, Declined]:
    """What the mask is, proven for every start ``P`` in ``0 .. cache - L`` and every length
    ``L`` the step may have (``rows``: an int, or a dynamic length's SymInt), all leading dims 1
    or per head: :data:`.plan.CAUSAL` if it is the causal mask from ``P`` (bool: True where
    attended; float: 0 there, -inf elsewhere); a :attr:`.plan.MaskKind.WINDOW` proof if it is
    that mask within a sliding window of ``W`` rows (row ``l`` attends ``P + l - W + 1 .. P +
    l``, W read from the mask at the last position); :data:`.plan.ATTENDS` if no row of it is
    fully blocked; else Declined (why not)."""
    lengths = positions.length_bounds(rows, cache)
    if lengths is None or not lengths:
        return Declined(f"the step's length {rows} has no bounds within the cache's {cache} rows")
    function = MaskFunction(mask, start, static_values, written, numbers, rows)
    if function.reason:
        return Declined(function.reason)
    heads = ([1] * 4 + list(tensor_val(mask).shape))[-3]
    elements = heads * cache * sum((cache - length + 1) * length for length in lengths)
    if elements > ELEMENT_BUDGET:
        return Declined(f"the mask has {elements:.1e} elements to evaluate over every start and "
                        f"length, more than {ELEMENT_BUDGET:.1e}")
    p = tensor_val(start)
    expected = _Expected(cache)
    evaluations, batches, kinds, why = 0, None, None, None
    try:
        with torch.no_grad():
            for length in lengths:
                starts = torch.arange(cache - length + 1, dtype=p.dtype)
                given = length if isinstance(rows, torch.SymInt) else None
                evaluations += len(starts)
                if evaluations > LOOP_BUDGET and batches is None:
                    batches = _vmaps(function, starts[:1], given)
                    if not batches:
                        return Declined(f"the mask cannot be evaluated in batches and has "
                                        f"more than {LOOP_BUDGET:,} cases to check")
                batch = max(1, BATCH_ELEMENTS // (heads * length * cache))
                try:
                    checked = _checked(function, starts, given, length, cache, expected, kinds, why,
                                       batch)
                except Exception:  # noqa: BLE001 - said as an evaluation of every start says it
                    checked = _checked(function, starts, given, length, cache, expected, kinds, why,
                                       len(starts))
                if isinstance(checked, str):
                    return Declined(checked)
                kinds, why = checked
                if not kinds:
                    return Declined(why)
    except Exception as error:  # noqa: BLE001 - a mask this evaluation cannot run: not proven
        return Declined(f"the mask could not be evaluated ({type(error).__name__}: {error})")
    return kinds[0]


def _checked(function: MaskFunction, starts, given, length: int, cache: int,
             expected: "_Expected", kinds, why, batch: int):
    """(the kinds the mask still is, why the most precise one failed) over ``starts`` (of one
    length), evaluated ``batch`` starts at a time in order (the first failing start named);
    ``kinds`` None: read first from the last start's batch. Every batch is evaluated, even once
    no kind is left, so that an evaluation which raises at some start raises here too; or why
    the mask has other leading dims."""
    parts = starts.split(batch)
    last = None
    if kinds is None:
        last = _normalized(function.batched(parts[-1], given), len(parts[-1]))
        if isinstance(last, str):
            return last
        kinds = _kinds(last, parts[-1], length, cache)
    for index, part in enumerate(parts):
        got = last if last is not None and index == len(parts) - 1 else \
            _normalized(function.batched(part, given), len(part))
        if isinstance(got, str):
            return got
        kinds, why = _still(kinds, got, part, length, expected, why)
    return kinds, why


def _vmaps(function: MaskFunction, starts: torch.Tensor, length: int) -> bool:
    try:
        torch.vmap(lambda p: function(p, length))(starts)
        return True
    except Exception:  # noqa: BLE001 - no batching rule for an op of the mask
        return False


def _normalized(got: torch.Tensor, count: int):
    """``got`` ([N, *mask]) as [N, heads, rows, cache] (heads and rows possibly 1), or why it
    has other leading dims."""
    if got.dim() > 4 and any(d != 1 for d in got.shape[1:-3]):
        return f"the mask has leading dims {tuple(got.shape[1:-2])}"
    if got.dim() == 2:
        return got.reshape(count, 1, 1, -1)
    if got.dim() == 3:
        return got.reshape(count, 1, *got.shape[-2:])
    return got.reshape(count, *got.shape[-3:])


def _attended(got: torch.Tensor) -> torch.Tensor:
    return got if got.dtype == torch.bool else got != float("-inf")


def _kinds(got: torch.Tensor, starts, rows: int, cache: int) -> list:
    """The kinds this mask may be proven to be, most precise first: causal, a window read from
    its last row at the last start, no fully blocked row."""
    last = _attended(got[-1, 0, -1])
    position = int(starts[-1]) + rows - 1
    window = int(last[:position + 1].sum())
    kinds = [CAUSAL]
    if 0 < window <= position and bool(last[position + 1 - window:position + 1].all()):
        kinds.append(Proof(MaskKind.WINDOW, window))
    return kinds + [ATTENDS]


class _Expected:
    """What a kind of mask is at each position: a ``[S, S]`` table, row ``q`` the expected row
    of a query at position ``q`` (bool, or 0 / -inf), read for ``N`` consecutive starts ``P``
    from ``first`` of a step of ``L`` rows as a strided view ``[N, 1, L, S]`` (rows ``P .. P +
    L - 1``: nothing copied)."""

    def __init__(self, cache: int):
        self.cache, self._tables = cache, {}

    def rows(self, kind: Proof, dtype: torch.dtype, count: int, rows: int, first: int = 0
             ) -> torch.Tensor:
        if (kind, dtype) not in self._tables:
            at, columns = torch.arange(self.cache)[:, None], torch.arange(self.cache)[None, :]
            table = columns <= at
            if kind.kind is MaskKind.WINDOW:
                table = table & (columns > at - kind.window)
            if dtype != torch.bool:
                table = torch.where(table, 0.0, float("-inf")).to(dtype)
            self._tables[kind, dtype] = table
        return self._tables[kind, dtype].as_strided((count, 1, rows, self.cache),
                                                    (self.cache, 0, self.cache, 1),
                                                    first * self.cache)

    def same_bytes(self, kind: Proof, got: torch.Tensor, first: int) -> bool:
        """Whether ``got`` ([N, heads, L, S], after :meth:`rows` for its kind and dtype) holds
        the very bytes of the expected rows at every start from ``first``, compared 8 bytes at a
        time (a bool mask's 1-byte elements: torch.equal's element-wise pass is about 5x
        slower). Equal bytes are equal values (the table holds no NaN); False where unequal or
        not comparable so (then compared element by element)."""
        table = self._tables[kind, got.dtype]
        width = self.cache * got.element_size()
        if width % 8 or got.shape[-1] != self.cache or not got.is_contiguous():
            return False
        words, (count, heads, rows) = width // 8, got.shape[:3]
        try:
            got_words = got.view(torch.int64)
        except RuntimeError:    # storage not aligned to 8 bytes
            return False
        want = table.view(torch.int64).as_strided((count, heads, rows, words),
                                                  (words, 0, words, 1), first * words)
        return torch.equal(got_words, want)


def _still(kinds: list, got, starts, rows: int, expected: _Expected, why) -> tuple:
    """(the kinds ``got`` still is at these starts, why the most precise one failed)."""
    kept = []
    for kind in kinds:
        if kind == ATTENDS and kept:    # causal, or a window: every row attends its own position
            failed = None
        elif kind == ATTENDS:
            blocked = ~_attended(got).any(-1).flatten(1).all(1)
            failed = _first(blocked, starts, rows, "a row of the mask attends no cache row")
        elif got.shape[-2] == 1 and rows != 1:
            failed = f"the mask has one row for a step of {rows}"
        else:
            first = int(starts[0])
            want = expected.rows(kind, got.dtype, len(starts), rows, first).expand(got.shape)
            failed = None if expected.same_bytes(kind, got, first) else \
                _differs(got, want, starts, rows, kind)
        if failed is None:
            kept.append(kind)
        elif why is None and not kept:
            why = failed
    return kept, why


def _differs(got, want, starts, rows: int, kind: Proof) -> Optional[str]:
    """Why ``got`` is not ``want`` (the first start where it is not), or None: one pass where
    they are equal."""
    if torch.equal(got, want):
        return None
    what = "the causal mask from the cache position" if kind == CAUSAL else kind.text
    return _first((got != want).flatten(1).any(1), starts, rows,
                  f"the mask is not {what} (padding, sliding window, or another mask)")


def _first(wrong: torch.Tensor, starts, rows: int, what: str) -> Optional[str]:
    if not bool(wrong.any()):
        return None
    position = int(starts[wrong.nonzero()[0, 0]])
    length = f" for {rows} rows" if rows != 1 else ""
    return f"at position {position}{length} {what}"
