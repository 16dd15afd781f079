"""xnnfold: fold computed GEMM weights and biases so that ExecuTorch's XNNPACK delegate takes them."""

import importlib
import sys
import types

# The public names are imported on first use (PEP 562), not here: importing executorch prints
# dependency noise (torchao, torch's _pytree), and the command line silences it first.
_PUBLIC = {"XnnpackPartitioner": "partitioner", "fold_gemm_params": "partitioner",
           "FoldGemmParams": "partitioner", "RuleSet": "steps.fold.rules", "Rule": "decision",
           "explain": "explain", "format_explanation": "explain",
           "FoldResult": "result", "GemmOperand": "result"}

__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    # Importing the submodule ``xnnfold.explain`` sets the package attribute ``explain`` to
    # that module; the public name is the function, as it was when this file imported it.
    def __setattr__(self, name, value):
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
