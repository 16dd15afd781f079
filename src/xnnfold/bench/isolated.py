"""Lower one (model, variant) in a process of its own: lowering seconds and peak RSS.

Peak memory means something only per process: a process that lowered stock first still holds
its allocator's pages when xnnfold lowers. So each variant is lowered in a fresh process,
which builds the model from its name (seeded), the user's factory (imported there by its
spec, the caller's folder on ``sys.path``) or .pt2 file (:mod:`xnnfold.bench.sources`), exports it, lowers it and writes the .pte to a
file; the parent runs it. The processes are forked from a *forkserver* that has imported torch
and executorch once (saving their import, 5-10 s, per variant) and has run no torch op, so it
has no OpenMP pool to inherit (a process forked from one that started it can hang).

Peak RSS is the kernel's high-water mark (``VmHWM``) of that process, reset just before the
lowering, so that it counts the lowering on top of what the process already held (imports,
model, export), which :attr:`Lowering.base_rss_mib` gives.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from dataclasses import dataclass, field
from typing import Optional

IDEAL = "ideal"
EAGER_EXPORT = "eager-export"    # the model's eager-attention export, lowered with stock


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


def _child(source, variant: str, pte_path: str, verbose: bool) -> Lowering:
    if not verbose:
        from .quiet import silence_python
        silence_python()
    from .measure import STOCK, lower
    from .sources import export

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
    return Lowering(variant, pte_path, len(lowered.gemms_outside), lowered.delegate_calls,
                    lowered.lower_seconds, peak, base, lowered.delegation,
                    gemm_rows(lowered))


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


_PRELOAD = ["xnnfold.bench.measure"]     # torch, executorch.exir and xnnfold's pass, imported once


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def lower_isolated(source, variant: str, folder: str, verbose: bool = False) -> Lowering:
    """Lower ``source`` (a :class:`~xnnfold.bench.sources.ModelSource`, or a built-in or zoo
    model's name) as ``variant`` in a process of its own."""
    from .sources import ModelSource

    if isinstance(source, str):
        source = ModelSource(source)
    stem = re.sub(r"[^\w.-]+", "_", source.name)
    pte_path = os.path.join(folder, f"{stem}.{variant}.pte")
    pool = _context().Pool(1)
    try:
        return pool.apply(_child, (source, variant, pte_path, verbose))
    finally:
        pool.close()   # not terminate(): a terminated pool leaks its semaphores (a warning)
        pool.join()
