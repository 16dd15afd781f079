"""A .pte loaded and run on the ExecuTorch runtime (the wheel's pybindings), with the kernels it
calls registered first; every load of a .pte in the package goes through
:func:`verified_program` first."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

# The identifier of executorch's program schema (the wheel's schema/program.fbs:
# ``file_identifier "ET12"``), bytes 4 to 8 of every .pte.
PROGRAM_IDENTIFIER = b"ET12"


class NotAPte(ValueError):
    """Bytes the ExecuTorch runtime refuses as a program: one line saying why."""


def identifier_problem(head: bytes) -> Optional[str]:
    """Why the bytes ``head`` (a file's first 8 or more) do not start an ExecuTorch program,
    in one line, or None. Nothing imported: the command line checks a .pte with it first."""
    if len(head) < 8:
        return f"not an ExecuTorch program ({len(head)} byte(s))"
    if head[4:8] != PROGRAM_IDENTIFIER:
        return (f"not an ExecuTorch program (bytes 4-8 are "
                f"{head[4:8].decode('ascii', 'backslashreplace')}, not "
                f"{PROGRAM_IDENTIFIER.decode()})")
    return None


def verified_program(pte: Union[bytes, str, Path], data_path: Union[str, Path, None] = None):
    """``pte`` (its bytes, or its file) loaded by the runtime's ``Runtime.load_program`` with
    its verifier (``Verification.InternalConsistency``; ``data_path``: the .ptd it reads its
    external constants from): an ``executorch.runtime.Program``. Raises :class:`NotAPte` (one
    line) for bytes that are not a program, or a corrupt or truncated one. What it spares the
    caller (executorch 1.5.1): a wrong identifier is refused here, before the runtime logs
    it — the runtime quotes the file's bytes in its log line, and the pybindings abort the
    process (SIGABRT, no message) when a log line is not UTF-8 — and a flatbuffer the verifier
    refuses never reaches the pybindings' module loader, which can crash on it (SIGSEGV)."""
    from executorch.runtime import Runtime, Verification

    from ..usage import first_line
    from .quiet import failure_summary, runtime_log

    if isinstance(pte, (str, Path)):
        with open(pte, "rb") as file:
            head, source = file.read(8), str(pte)
    else:
        head, source = pte[:8], bytes(pte)
    problem = identifier_problem(head)
    if problem is not None:
        raise NotAPte(problem)
    with runtime_log() as log:
        try:
            return Runtime.get().load_program(
                source, verification=Verification.InternalConsistency,
                data_path=None if data_path is None else str(data_path))
        except Exception as error:  # noqa: BLE001 - whatever the runtime raises, say it
            failure = error
    said = failure_summary(log)
    raise NotAPte(f"a corrupt or truncated ExecuTorch program"
                  f"{'' if data_path is None else f' or .ptd ({data_path})'}: the runtime "
                  f"refused it ({first_line(failure)}{'; ' + said if said else ''})")


def load_llm_kernels(pte: bytes) -> None:
    """Register executorch's LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``, in
    the wheel's custom-ops library) if ``pte`` calls them (a .pte lowered with
    ``llm_kernels=True``): the runtime finds them only once that library is loaded, else it
    refuses the method (operator missing). The operator names are plain strings of the .pte."""
    if b"llama::" in pte:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


def method_constant(program, name: str, default=None):
    """What the constant method ``name`` of a loaded ``executorch.runtime`` program returns (one
    value, or the list), or ``default`` when the program has no such method: the metadata
    exports emit (``get_max_seq_len``, ``get_eos_ids``...)."""
    if name not in program.method_names:
        return default
    values = list(program.load_method(name).execute(()))
    return values if len(values) != 1 else values[0]


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
