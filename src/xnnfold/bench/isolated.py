"""Lower one (model, variant) in a process of its own: lowering seconds and peak RSS.

Peak memory means something only per process: a process that lowered stock first still holds
its allocator's pages when xnnfold lowers. So each variant is lowered in a fresh process,
which builds the model from its name (seeded), exports it, lowers it and writes the .pte to a
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
from dataclasses import dataclass, field
from typing import Optional

IDEAL = "ideal"


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


def _child(name: str, variant: str, pte_path: str, verbose: bool) -> Lowering:
    if not verbose:
        from .quiet import silence_python
        silence_python()
    import torch

    from . import models
    from .measure import STOCK, lower

    case = models.build(name)
    module = case.ideal if variant == IDEAL else case.model
    ep = torch.export.export(module, case.inputs, dynamic_shapes=case.dynamic_shapes)
    reset = _reset_peak_rss()
    base = _status_mib("VmRSS")
    lowered = lower(ep, STOCK if variant == IDEAL else variant)
    peak = _status_mib("VmHWM") if reset else None
    with open(pte_path, "wb") as file:
        file.write(lowered.pte)
    return Lowering(variant, pte_path, len(lowered.gemms_outside), lowered.delegate_calls,
                    lowered.lower_seconds, peak, base, lowered.delegation)


_PRELOAD = ["xnnfold.bench.measure"]     # torch, executorch.exir and xnnfold's pass, imported once


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def lower_isolated(name: str, variant: str, folder: str, verbose: bool = False) -> Lowering:
    """Lower built-in or zoo model ``name`` as ``variant`` in a process of its own."""
    pte_path = os.path.join(folder, f"{name}.{variant}.pte")
    pool = _context().Pool(1)
    try:
        return pool.apply(_child, (name, variant, pte_path, verbose))
    finally:
        pool.close()   # not terminate(): a terminated pool leaks its semaphores (a warning)
        pool.join()
