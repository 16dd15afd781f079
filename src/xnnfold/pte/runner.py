"""A .pte loaded and run on the ExecuTorch runtime (the wheel's pybindings), with the kernels it
calls registered first."""

from __future__ import annotations


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
    """A .pte loaded on the ExecuTorch runtime. Keeps its buffer alive, as the loader needs."""

    def __init__(self, pte: bytes):
        from executorch.extension.pybindings.portable_lib import (
            _load_for_executorch_from_buffer,
        )
        # the quantized ops' kernels (a PT2E-quantized .pte's quantize/dequantize left outside
        # delegates): without them it fails with error 0x14, operator missing
        import executorch.kernels.quantized  # noqa: F401

        load_llm_kernels(pte)          # llm_kernels=True: llama::update_cache, custom_sdpa
        self._buffer = pte   # the loaded module does not own it
        self._module = _load_for_executorch_from_buffer(self._buffer)

    def run(self, inputs: tuple) -> list:
        return list(self._module.forward(tuple(inputs)))


def run_pte(pte: bytes, inputs: tuple) -> list:
    return PteRunner(pte).run(inputs)
