"""Which probe answers the *delegated* rule: the fast one, checked against the whole-program one
when verification is on (``XNNFOLD_VERIFY_PROBE=1`` or ``verify=True``).

A probe is a callable ``(folded program, [FoldedConstant]) -> set of state keys`` of the folded
constants XNNPACK would take.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from .errors import FoldError
from .fast_probe import FastProbe, consumer_gemms
from .fold import copy_program
from .probe import delegated_placeholders
from .probe_cut import ProbeUnsupported, param_keys
from .shape_env import give_own_shape_env, has_unbacked_symbols

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
        if has_unbacked_symbols(program):
            probed = copy_program(program)
            give_own_shape_env(probed)
        return delegated_placeholders(probed, partitioner) & folded
    return probe


def make_probe(partitioner: Partitioner, verify: Optional[bool] = None) -> Probe:
    """The fast probe (one per fold: it caches by signature); with ``verify``, also the
    whole-program probe, raising :class:`ProbeDisagreement` naming the GEMM on any difference.
    ``verify=None`` reads ``XNNFOLD_VERIFY_PROBE``."""
    verify = verify_requested() if verify is None else verify
    fast, whole = FastProbe(partitioner), whole_program_probe(partitioner)

    def probe(program: ExportedProgram, constants: list) -> set:
        try:
            answer = fast(program, constants)
        except ProbeUnsupported as error:   # a known limit (an unbacked dim): not a bug
            logger.warning("xnnfold: the fast probe cannot model node %r (%s); asking the "
                           "whole-program probe", error.node, error.reason)
            return whole(program, constants)
        except Exception as error:  # noqa: BLE001 - the whole-program probe still answers
            if verify:   # in the test suite, a failure of the fast path is a failure
                raise
            where = ", ".join(g.name for g in consumer_gemms(program, constants)[:3])
            logger.warning("xnnfold: the fast probe failed at %s (%s: %s); asking the "
                           "whole-program probe", where, type(error).__name__, error)
            return whole(program, constants)
        if verify:
            _check_agreement(program, constants, answer, whole(program, constants))
        return answer

    probe.fast = fast
    return probe


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
