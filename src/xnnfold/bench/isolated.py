"""The report's lowerings: one (model, variant) lowered in a process of its own, for its lowering
seconds and peak RSS, its .pte run there once (a .pte can abort the runtime).

Peak memory means something only per process: a process that lowered stock first still holds
its allocator's pages when xnnfold lowers. So each variant is lowered in a fresh process
(:class:`xnnfold.pte.child.Child`, forked from a forkserver that imported torch and
executorch once), which builds the model from its name (seeded), the user's factory
(imported there by its spec, the caller's folder on ``sys.path``) or .pt2 file
(:mod:`xnnfold.models.sources`), exports it, lowers it, writes the .pte to a file and runs it
once on the example inputs: a .pte that does not run, or aborts the process, is reported as
such (:attr:`Lowering.run_error`) and never loaded by the parent, which times the others.

Peak RSS is the kernel's high-water mark (``VmHWM``) of that process, reset just before the
lowering, so that it counts the lowering on top of what the process already held (imports,
model, export), which :attr:`Lowering.base_rss_mib` gives.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ..pte.child import Child
from ..pte.isolated import does_not_run
from ..pte.variants import EAGER_EXPORT, IDEAL


@dataclass
class Lowering:
    """What the child reports; the .pte itself is in ``pte_path``."""

    variant: str
    pte_path: str
    gemms_outside: int
    delegate_calls: int
    lower_seconds: float
    peak_rss_mib: Optional[float]
    base_rss_mib: Optional[float]
    delegation: dict = field(default_factory=dict)
    gemms: list = field(default_factory=list)      # gemm_rows(): in the user's terms
    run_error: Optional[str] = None                # why the .pte does not run, if it does not


def _status_mib(key: str) -> Optional[float]:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def _child(send, source, variant: str, pte_path: str, verbose: bool) -> None:
    if not verbose:
        from ..pte.quiet import silence_python
        silence_python()
    from ..pte import STOCK, lower, run_pte
    from ..models.sources import export

    case = source.build()
    module = {IDEAL: case.ideal, EAGER_EXPORT: case.eager_export and case.eager_export()
              }.get(variant)
    ep = export(case, module)
    reset = _reset_peak_rss()
    base = _status_mib("VmRSS")
    lowered = lower(ep, STOCK if variant in (IDEAL, EAGER_EXPORT) else variant)
    peak = _status_mib("VmHWM") if reset else None
    with open(pte_path, "wb") as file:
        file.write(lowered.pte)
    send(Lowering(variant, pte_path, len(lowered.gemms_outside), lowered.delegate_calls,
                  lowered.lower_seconds, peak, base, lowered.delegation, gemm_rows(lowered)))
    run_pte(lowered.pte, case.inputs)          # raises, or aborts this process
    send(None)


def gemm_rows(lowered) -> list:
    """Per GEMM operand, in the user's terms: the module it came from, what xnnfold did with
    it (the xnnfold variant), or, for another variant, which GEMMs stayed outside delegates."""
    fold = lowered.fold
    if fold is not None:
        return [{"gemm": o.gemm, "module": o.module, "operand": o.role, "status": str(o.status),
                 "rule": str(o.rule) if o.rule else None, "reason": o.reason}
                for o in fold.operands]
    return [{"gemm": name, "module": module, "status": "outside delegates"}
            for name, module in lowered.gemm_sources_outside]


def lower_isolated(source, variant: str, folder: str, verbose: bool = False) -> Lowering:
    """Lower ``source`` (a :class:`~xnnfold.models.sources.ModelSource`, or a built-in or zoo
    model's name) as ``variant`` in a process of its own, and run the .pte there once: its
    :attr:`~Lowering.run_error` says why it does not run. A lowering that fails raises."""
    from ..pte.quiet import failure_summary, runtime_log
    from ..models.sources import ModelSource

    if isinstance(source, str):
        source = ModelSource(source)
    stem = re.sub(r"[^\w.-]+", "_", source.name)
    pte_path = os.path.join(folder, f"{stem}.{variant}.pte")
    failure = None
    with Child(_child, source, variant, pte_path, verbose) as child:
        lowering = child.receive()                        # a lowering that fails raises here
        with runtime_log() as log:
            try:
                child.receive()
            except Exception as error:  # noqa: BLE001 - a .pte that does not run is a finding
                failure = error
    if failure is not None:
        lowering.run_error = does_not_run(failure, failure_summary(log))
    return lowering
