"""Which probe answers the *delegated* rule: the fast one, checked against the whole program
when verification is on (``XNNFOLD_VERIFY_PROBE=1`` or ``verify=True``).

A probe is a callable ``(folded program, [FoldedConstant]) -> set of state keys`` of the folded
constants XNNPACK would take. With verification, every answer of the fast probe is compared
with the whole-program probe's, except the last one of a fold that the lowering itself then
decomposes: that one is compared with what the real ``partition()`` tags (see
:meth:`VerifiedProbe.settle`), the same pipeline without a second decomposition.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from ..errors import FoldError, warn_or_raise
from .fast import FastProbe, consumer_gemms
from ..steps.fold import copy_program
from .whole import delegated_placeholders, tagged_keys
from .cut import ProbeUnsupported, param_keys
from ..shape_env import give_own_shape_env, needs_own_shape_env

logger = logging.getLogger("xnnfold")

VERIFY_ENV = "XNNFOLD_VERIFY_PROBE"

Probe = Callable[[ExportedProgram, list], set]


class ProbeDisagreement(FoldError):
    """The fast probe and the whole-program probe disagree about a GEMM: a bug of xnnfold."""


def verify_requested() -> bool:
    return os.environ.get(VERIFY_ENV, "") not in ("", "0")


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


class VerifiedProbe:
    """The fast probe (one per fold: it caches by signature); with ``verify``, also the
    whole-program one, raising :class:`ProbeDisagreement` naming the GEMM on any difference."""

    def __init__(self, partitioner: Partitioner, verify: Optional[bool] = None):
        self.verify = verify_requested() if verify is None else verify
        self.fast, self.whole = FastProbe(partitioner), whole_program_probe(partitioner)
        self.pending: Optional[PendingCheck] = None
        self.hand_over_last = False

    def __call__(self, program: ExportedProgram, constants: list) -> set:
        self.check_pending()
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
            self.pending = PendingCheck(program, constants, answer, self.whole)
        return answer

    def check_pending(self) -> None:
        """Verify the last answer now, with the whole-program probe."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.now()

    def settle(self, program: ExportedProgram) -> None:
        """At the end of a fold whose result is ``program``: verify the last answer now,
        unless it is about ``program`` and ``hand_over_last`` is set (a lowering follows, whose
        ``partition()`` checks it: see :meth:`PendingCheck.against`)."""
        if not (self.hand_over_last and self.pending is not None
                and self.pending.program is program):
            self.check_pending()


def make_probe(partitioner: Partitioner, verify: Optional[bool] = None) -> VerifiedProbe:
    """``verify=None`` reads ``XNNFOLD_VERIFY_PROBE``."""
    return VerifiedProbe(partitioner, verify)


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
