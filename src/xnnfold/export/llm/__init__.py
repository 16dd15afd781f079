"""Text generation with a transformers causal LM on ExecuTorch: a generation-ready .pte (one
``forward`` over a static KV cache, the layout executorch's ``TextLLMRunner`` runs,
:mod:`xnnfold.export.llm.export`; its linears quantized on request, :mod:`.quantize`), and
generation on the runtime with prefill and decode timed (:mod:`xnnfold.export.llm.runtime`),
from token ids or, with the tokenizer beside the .pte, text (:mod:`xnnfold.export.llm.text`).

The names below import on first use (PEP 562): importing this package imports nothing heavy;
the export imports transformers when called, the runtime executorch's runtime when a .pte is
loaded; the pass (``xnnfold``) never imports this package.
"""

import importlib

_PUBLIC = {"export_causal_lm": "export", "lower_generation": "export",
           "causal_lm_to_pte": "export", "GenerationPrograms": "export",
           "LoweredGeneration": "export", "CannotExport": "export", "Generator": "runtime", "Generation": "runtime",
           "NotAGenerationProgram": "runtime", "generate": "runtime",
           "set_threads": "runtime", "Sampling": "sampling", "quantize_linears": "quantize",
           "cache_sizes": "sizes"}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
