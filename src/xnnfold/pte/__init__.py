"""Lowering a program, running the .pte on the ExecuTorch runtime and comparing its outputs with
eager's: what the tests, the exports, the command line and the bench share, so that they never
disagree (one lowering, one runner, one comparison).

- :mod:`.lowering` — :func:`lower` a program as one of the :mod:`.variants` (stock, xnnfold, ...)
  and what the lowered graph says (:class:`Lowered`: ops outside delegates, calls, constants);
- :mod:`.runner` — :class:`PteRunner`, a .pte loaded with the kernels it calls;
- :mod:`.compare` — :func:`compare_outputs`, the one comparison (tolerance scaled to the values);
- :mod:`.timing` — variants timed interleaved in one process; :mod:`.isolated` — a .pte run in a
  process of its own (:mod:`.child`); :mod:`.devtools` — executorch's ETDump and delegation
  info; :mod:`.quiet` — dependency noise kept off the terminal.

The names below import on first use (PEP 562): the command line imports this package before
torch. Above the pass, below the exports: it imports the pass only.
"""

import importlib

_PUBLIC = {"lower": "lowering", "Lowered": "lowering", "inspect_lowered": "lowering",
           "PteRunner": "runner", "run_pte": "runner", "load_llm_kernels": "runner",
           "compare_outputs": "compare", "Comparison": "compare",
           "default_tolerance": "compare", "quantized_tolerance": "compare",
           "STOCK": "variants", "XNNFOLD": "variants", "XNNFOLD_SIZE": "variants",
           "STOCK_FLAG": "variants", "CONSTANT_PROP": "variants"}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
