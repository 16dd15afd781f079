"""Run a .pte in a process of its own (:class:`xnnfold.pte.child.Child`): a .pte can abort the
runtime (portable kernels assert), which ends that process, not the caller's. What
``xnnfold lower --check`` uses; the report's lowerings each in a process of their own are
:mod:`xnnfold.bench.isolated`'s."""

from __future__ import annotations

from .child import Child, ChildDied


def does_not_run(error: Exception, logged: str = "") -> str:
    """One line: why a .pte does not run on the ExecuTorch runtime (the runtime's error, or
    the signal that ended the process), with what the runtime logged about it."""
    from ..usage import first_line

    said = str(error) if isinstance(error, ChildDied) else first_line(error)
    return f"the .pte does not run on the ExecuTorch runtime: {said}" + \
        (f" ({logged})" if logged else "")


# what running a .pte needs, imported once by the forkserver (when this starts it)
RUN_PRELOAD = ["torch", "executorch.extension.pybindings.portable_lib",
               "executorch.kernels.quantized"]


def _run_child(send, pte_path: str, inputs: tuple) -> None:
    from .quiet import silence_python
    from .runner import run_pte

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
    :func:`~xnnfold.pte.compare.quantized_tolerance`. A :class:`Comparison`: not ok, with
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
