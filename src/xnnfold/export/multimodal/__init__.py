"""A transformers vision-language model to the .pte executorch's ``MultimodalRunner`` runs
(``executorch.extension.llm.runner``, in the wheel): three methods, the runner's names
(:mod:`.export`), and generation with them on the runtime, greedy, with its input checked
(:mod:`.runtime`); ``xnnfold hf``'s export and check of such a folder is
:mod:`xnnfold.export.hf.multimodal`. An audio-language model (Voxtral) the same way, its
``audio_encoder`` in place of ``vision_encoder``: :mod:`.audio`, :mod:`.audio_runtime`,
:mod:`xnnfold.export.hf.audio`.

The names below import on first use (PEP 562): importing this package imports nothing heavy.
"""

import importlib

_PUBLIC = {"export_image_text_to_text": "export", "SUPPORTED": "export",
           "image_text_to_pte": "export", "MultimodalGenerator": "runtime",
           "BadInput": "runtime", "runner_inputs": "processor_inputs",
           "export_audio_text_to_text": "audio", "audio_text_to_pte": "audio",
           "AudioGenerator": "audio_runtime"}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
