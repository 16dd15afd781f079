"""A .pte loaded and run on the ExecuTorch runtime (the wheel's pybindings), with the kernels it
calls registered first; every load of a .pte in the package goes through
:func:`verified_program` first."""

from __future__ import annotations

# The identifier of executorch's program schema (the wheel's schema/program.fbs:
# ``file_identifier "ET12"``), bytes 4 to 8 of every .pte.
PROGRAM_IDENTIFIER = b"ET12"


class NotAPte(ValueError):
    """Bytes the ExecuTorch runtime refuses as a program: one line saying why."""


def verified_program(pte: bytes):
    """``pte`` loaded by the runtime's ``Runtime.load_program`` with its verifier
    (``Verification.InternalConsistency``): an ``executorch.runtime.Program``. Raises
    :class:`NotAPte` (one line) for bytes that are not a program, or a corrupt or truncated
    one. What it spares the caller (executorch 1.5.1): a wrong identifier is refused here,
    before the runtime logs it — the runtime quotes the file's bytes in its log line, and
    the pybindings abort the process (SIGABRT, no message) when a log line is not UTF-8 —
    and a flatbuffer the verifier refuses never reaches the pybindings' module loader, which
    can crash on it (SIGSEGV)."""
    from executorch.runtime import Runtime, Verification

    from ..usage import first_line
    from .quiet import failure_summary, runtime_log

    if len(pte) < 8:
        raise NotAPte(f"not an ExecuTorch program ({len(pte)} byte(s))")
    if pte[4:8] != PROGRAM_IDENTIFIER:
        raise NotAPte(f"not an ExecuTorch program (bytes 4-8 are "
                      f"{pte[4:8].decode('ascii', 'backslashreplace')}, not "
                      f"{PROGRAM_IDENTIFIER.decode()})")
    with runtime_log() as log:
        try:
            return Runtime.get().load_program(bytes(pte),
                                              verification=Verification.InternalConsistency)
        except Exception as error:  # noqa: BLE001 - whatever the runtime raises, say it
            failure = error
    said = failure_summary(log)
    raise NotAPte(f"a corrupt or truncated ExecuTorch program: the runtime refused it "
                  f"({first_line(failure)}{'; ' + said if said else ''})")


def load_llm_kernels(pte: bytes) -> None:
    """Register executorch's LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``, in
    the wheel's custom-ops library) if ``pte`` calls them (a .pte lowered with
    ``llm_kernels=True``): the runtime finds them only once that library is loaded, else it
    refuses the method (operator missing). The operator names are plain strings of the .pte."""
    if b"llama::" in pte:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


class PteRunner:
    """A .pte loaded on the ExecuTorch runtime (:func:`verified_program` first). Keeps its
    buffer alive, as the loader needs."""

    def __init__(self, pte: bytes):
        from executorch.extension.pybindings.portable_lib import (
            _load_for_executorch_from_buffer,
        )
        # the quantized ops' kernels (a PT2E-quantized .pte's quantize/dequantize left outside
        # delegates): without them it fails with error 0x14, operator missing
        import executorch.kernels.quantized  # noqa: F401

        verified_program(pte)
        load_llm_kernels(pte)          # llm_kernels=True: llama::update_cache, custom_sdpa
        self._buffer = pte   # the loaded module does not own it
        self._module = _load_for_executorch_from_buffer(self._buffer)

    def run(self, inputs: tuple) -> list:
        return list(self._module.forward(tuple(inputs)))


def run_pte(pte: bytes, inputs: tuple) -> list:
    return PteRunner(pte).run(inputs)
