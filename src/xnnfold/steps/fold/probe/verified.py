"""Which probe answers the *delegated* rule: the fast one, checked against the whole program
when verification is on (``Config.verify_probe``, :mod:`xnnfold.config`, or ``verify=True``).

A probe is a callable ``(folded program, [FoldedConstant]) -> set of state keys`` of the folded
constants XNNPACK would take. With verification, every answer of the fast probe is compared
with the whole-program probe's, except the last one of a fold that the lowering itself then
decomposes: that one is compared with what the real ``partition()`` tags, the same pipeline
without a second decomposition. Which answer is checked when is :class:`Verification`'s
business, one object with four callers: the fold starts and fails
(:class:`~xnnfold.partitioner.FoldGemmParams`), the fold's probe reports each answer
(:class:`VerifiedProbe`), the pipeline ends the fold (:func:`xnnfold.pipeline.run`), and the
drop-in partitioner's ``partition()`` settles the answer handed over to it.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from .... import config
from ....errors import FoldError, warn_or_raise
from .fast import FastProbe, consumer_gemms
from ....graph.program_copy import copy_program
from .whole import delegated_placeholders, tagged_keys
from .cut import ProbeUnsupported, param_keys
from ....shape_env import give_own_shape_env, needs_own_shape_env

logger = logging.getLogger("xnnfold")

Probe = Callable[[ExportedProgram, list], set]


class ProbeDisagreement(FoldError):
    """The fast probe and the whole-program probe disagree about a GEMM: a bug of xnnfold."""


def whole_program_probe(partitioner: Partitioner) -> Probe:
    def probe(program: ExportedProgram, constants: list) -> set:
        keys = param_keys(program)
        folded = {keys[c.name] for c in constants if c.name in keys}
        # Its aborted lowering must leave nothing in the ShapeEnv the program shares with the
        # caller's: it lowers a copy with a ShapeEnv of its own.
        probed = program
        if needs_own_shape_env(program):
            probed = copy_program(program)
            give_own_shape_env(probed)
        return delegated_placeholders(probed, partitioner) & folded
    return probe


class PendingCheck:
    """The last fast answer of a fold, to be compared with the real lowering's partition."""

    def __init__(self, program: ExportedProgram, constants: list, answer: set, whole: Probe):
        self.program, self.constants, self.answer, self._whole = program, constants, answer, whole

    def now(self) -> None:
        """Compare with the whole-program probe (when no lowering of the program follows)."""
        _check_agreement(self.program, self.constants, self.answer,
                         self._whole(self.program, self.constants))

    def against(self, tagged_program: ExportedProgram, skip: set) -> None:
        """Compare with the tags of the real ``partition()`` of the program. ``skip``: names
        of the GEMMs the fold marked for a run-time weight after probing (their constants are
        then read at run time: not what the probe was asked)."""
        keys = param_keys(self.program)
        asked = [c for c in self.constants if not skip & set(c.consumers)]
        folded = {keys[c.name] for c in asked if c.name in keys}
        _check_agreement(self.program, asked, self.answer & folded,
                         tagged_keys(tagged_program) & folded)


class Verification:
    """What verification still owes: the fast probe's last answer, until it is compared with the
    whole program (:class:`PendingCheck`). Each answer is checked when the next one is asked
    for, or at the end of its fold; with ``partition_follows`` (the drop-in partitioner's, whose
    lowering decomposes and partitions the folded program anyway), the last answer of a fold
    about the program it returns is left for that ``partition()`` to check, if it is the first
    fold since the last ``partition()`` (several programs folded before any, a multi-method
    lowering, are checked at once, by the whole program)."""

    def __init__(self, partition_follows: bool = False):
        self._partition_follows = partition_follows
        self._pending: Optional[PendingCheck] = None
        self._folds_since_partition = 0

    def fold_starts(self) -> None:
        """A fold begins: an answer left from the fold before (no ``partition()`` came) is
        checked now."""
        self.check_now()
        self._folds_since_partition += 1

    def answered(self, check: PendingCheck) -> None:
        """The fold's probe answered (after :meth:`check_now` of the answer before)."""
        self._pending = check

    def check_now(self) -> None:
        """Verify the last answer now, with the whole-program probe."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.now()

    def fold_done(self, program: ExportedProgram) -> None:
        """The fold's result is ``program``: verify the last answer now, unless it is about
        ``program`` and a ``partition()`` of it follows, which checks it."""
        hand_over = self._partition_follows and self._folds_since_partition == 1
        if not (hand_over and self._pending is not None and self._pending.program is program):
            self.check_now()

    def fold_failed(self) -> None:
        """The fold was given up: its answers are about a program nobody lowers."""
        self._pending = None

    def partitioned(self, tagged_program: ExportedProgram, fold) -> None:
        """The lowering's ``partition()`` tagged ``tagged_program``: check the answer handed
        over against its tags. ``fold``: the :class:`~xnnfold.result.FoldResult` the lowering
        lowers (its run-time-weight GEMMs are not what the probe was asked)."""
        self._folds_since_partition = 0
        pending, self._pending = self._pending, None
        if pending is not None:
            marked = {row.gemm for row in fold.operands if row.runtime_weight}
            pending.against(tagged_program, marked)


class VerifiedProbe:
    """The fast probe (one per fold: it caches by signature); with ``verify``, also the
    whole-program one, raising :class:`ProbeDisagreement` naming the GEMM on any difference.
    Its answers are verified as ``verification`` says (default: each within the fold)."""

    def __init__(self, partitioner: Partitioner, verify: Optional[bool] = None,
                 verification: Optional[Verification] = None):
        self.verify = config.current().verify_probe if verify is None else verify
        self.fast, self.whole = FastProbe(partitioner), whole_program_probe(partitioner)
        self.verification = verification if verification is not None else Verification()

    def __call__(self, program: ExportedProgram, constants: list) -> set:
        self.verification.check_now()
        try:
            answer = self.fast(program, constants)
        except ProbeUnsupported as error:
            # A known limit (an unbacked dim), not a give-up: the whole-program probe, the
            # reference the fast one is checked against, answers exactly; only slower.
            logger.warning("xnnfold: the fast probe cannot model node %r (%s); asking the "
                           "whole-program probe", error.node, error.reason)
            return self.whole(program, constants)
        except Exception as error:  # noqa: BLE001 - the whole-program probe still answers
            if self.verify:      # verifying: a failure of the fast probe fails the fold
                raise
            where = ", ".join(g.name for g in consumer_gemms(program, constants)[:3])
            warn_or_raise(logger, "xnnfold: the fast probe failed at %s (%s: %s); asking the "
                          "whole-program probe", where, type(error).__name__, error)
            return self.whole(program, constants)
        if self.verify:
            self.verification.answered(PendingCheck(program, constants, answer, self.whole))
        return answer


def make_probe(partitioner: Partitioner, verify: Optional[bool] = None,
               verification: Optional[Verification] = None) -> VerifiedProbe:
    """``verify=None``: the settings in force (``xnnfold.config.current().verify_probe``)."""
    return VerifiedProbe(partitioner, verify, verification)


def _check_agreement(program, constants, fast: set, whole: set) -> None:
    if fast == whole:
        return
    keys = param_keys(program)
    differing = []
    for constant in constants:
        key = keys.get(constant.name)
        if (key in fast) != (key in whole):
            differing.append(f"{', '.join(constant.consumers)} reading {constant.name} "
                             f"(fast: {'taken' if key in fast else 'declined'}, whole program: "
                             f"{'taken' if key in whole else 'declined'})")
    gemm = constants[0].consumers[0] if constants and constants[0].consumers else "<program>"
    raise ProbeDisagreement(gemm, "probe disagreement: " + "; ".join(differing))
