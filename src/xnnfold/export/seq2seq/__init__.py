"""Encoder-decoder generation on ExecuTorch (Whisper, BART): one .pte in the layout
executorch's speech runner calls (``encoder`` once per input, returning every decoder layer's
cross-attention keys and values; ``text_decoder`` one token per call over a self-attention KV
cache of its own, :mod:`.export`), lowered with the tied output head's table stored once in a
.ptd beside it (:mod:`.lower`), and greedy generation through the runner's calls on the runtime
(:mod:`.runtime`; Whisper's prompt and logits processors: :mod:`.whisper`).

The names below import on first use (PEP 562); the pass never imports this package.
"""

import importlib

_PUBLIC = {"export_seq2seq": "export", "Seq2SeqPrograms": "export", "ENCODER": "export",
           "DECODER": "export", "lower_seq2seq": "lower", "LoweredSeq2Seq": "lower",
           "Seq2SeqProgram": "runtime", "Generated": "runtime",
           "NotASeq2SeqProgram": "runtime", "WhisperPrompt": "whisper",
           "read_features": "whisper"}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
