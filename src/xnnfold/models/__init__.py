"""Built-in models: the cases that motivate xnnfold, and their *ideal* rewrites.

The ideal rewrite computes the same math with plain ``nn.Linear`` / ``nn.Conv1d`` layers whose
weights are the values xnnfold folds: what a user would get by rewriting the model by hand. It
is the bar for delegate calls, bytes and latency. Every model is built from a seed, with
``in_proj_bias`` drawn at random (it is zero by default, which hides bias bugs).
The cases live in ``attention`` (MHA, the decoder layer) and ``computed`` (weight_norm, LoRA, a
tied head); :mod:`.builtin` holds the report's sets (built by name with
:func:`xnnfold.models.sources.build_named`, which also knows the :mod:`.zoo`: the models do
not); :mod:`.decoder_lm` the decoder LMs of the LLM benchmarks; :mod:`.catalog` the names alone.

Also :mod:`.sources` (where a model comes from: a name, a factory, a .pt2). The names below
import on first use (PEP 562): importing this package imports no torch (the command line
checks a model's name against :mod:`.catalog` before any heavy import).
"""

import importlib

_PUBLIC = {"Case": "case", "attention_case": "attention", "decoder_case": "attention",
           "IdealDecoderLayer": "attention", "lora_case": "computed",
           "tied_head_case": "computed", "weight_norm_case": "computed",
           "SMALL": "builtin", "LARGE": "builtin", "ALL": "builtin"}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
