"""Lower one (model, variant) in a process of its own: lowering seconds and peak RSS; and run
a .pte in a process of its own (a .pte can abort the runtime: portable kernels assert).

Peak memory means something only per process: a process that lowered stock first still holds
its allocator's pages when xnnfold lowers. So each variant is lowered in a fresh process
(:class:`xnnfold.bench.child.Child`, forked from a forkserver that imported torch and
executorch once), which builds the model from its name (seeded), the user's factory
(imported there by its spec, the caller's folder on ``sys.path``) or .pt2 file
(:mod:`xnnfold.bench.sources`), exports it, lowers it, writes the .pte to a file and runs it
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

from .child import Child, ChildDied
from .variants import EAGER_EXPORT, IDEAL  # noqa: F401 - re-exported


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
        from .quiet import silence_python
        silence_python()
    from .measure import STOCK, lower, run_pte
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
    """Lower ``source`` (a :class:`~xnnfold.bench.sources.ModelSource`, or a built-in or zoo
    model's name) as ``variant`` in a process of its own, and run the .pte there once: its
    :attr:`~Lowering.run_error` says why it does not run. A lowering that fails raises."""
    from .quiet import failure_summary, runtime_log
    from .sources import ModelSource

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


def does_not_run(error: Exception, logged: str = "") -> str:
    """One line: why a .pte does not run on the ExecuTorch runtime (the runtime's error, or
    the signal that ended the process), with what the runtime logged about it."""
    from .sources import first_line

    said = str(error) if isinstance(error, ChildDied) else first_line(error)
    return f"the .pte does not run on the ExecuTorch runtime: {said}" + \
        (f" ({logged})" if logged else "")


# what running a .pte needs, imported once by the forkserver (when this starts it)
RUN_PRELOAD = ["torch", "executorch.extension.pybindings.portable_lib",
               "executorch.kernels.quantized"]


def _run_child(send, pte_path: str, inputs: tuple) -> None:
    from .quiet import silence_python
    from .measure import run_pte

    silence_python()
    with open(pte_path, "rb") as file:
        send(run_pte(file.read(), inputs))


def run_isolated(pte_path: str, inputs: tuple) -> list:
    """The outputs of the .pte at ``pte_path`` on ``inputs``, run in a process of its own: a
    .pte that aborts the runtime ends that process, not this one. Raises ``RuntimeError`` with
    :func:`does_not_run`'s line when it does not run."""
    from .quiet import failure_summary, runtime_log

    with runtime_log() as log, Child(_run_child, pte_path, inputs, preload=RUN_PRELOAD) as child:
        try:
            return child.receive()
        except Exception as error:  # noqa: BLE001 - said in one line
            failure = error
    raise RuntimeError(does_not_run(failure, failure_summary(log)))


def check_pte(pte_path: str, inputs: tuple, expected, quantized: bool = False):
    """The .pte at ``pte_path`` run on ``inputs`` in a process of its own
    (:func:`run_isolated`) and compared with ``expected`` (eager's outputs) by
    ``compare_outputs``; a PT2E-quantized model's with
    :func:`~xnnfold.bench.compare.quantized_tolerance`. A :class:`Comparison`: not ok, with
    :func:`does_not_run`'s line as its reason, when the .pte does not run."""
    import math

    from .compare import Comparison, compare_outputs, quantized_tolerance

    try:
        outputs = run_isolated(pte_path, inputs)
    except RuntimeError as error:
        return Comparison(False, math.nan, math.nan, str(error))
    verdict = compare_outputs(outputs, expected,
                              **(quantized_tolerance(expected) if quantized else {}))
    if not verdict.ok:
        verdict.reason = f"its outputs differ from eager's: {verdict.reason}"
    return verdict
