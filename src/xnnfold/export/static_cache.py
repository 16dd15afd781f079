"""transformers' static KV cache around a causal LM: the one wrapper the exports and the bench's
decoder LMs build their programs from.

transformers' own ExecuTorch adapter (``transformers.integrations.executorch.
TorchExportableModuleForDecoderOnlyLM``, the ``StaticCache`` of ``cache_implementation=
"static"``) holds every layer's keys and values as buffers of ``max_cache`` rows, updated in
place at ``cache_position``; its module takes ``(input_ids (1, T), cache_position (T,))`` and
returns the logits. ``last_logits=True`` runs the output head on the last position only
(``logits_to_keep=1``): what generation reads, and the head is often the largest GEMM of a small
model. A family that needs more to be exported (OPT, Falcon's ALiBi, MPT) is called with it
(:mod:`.adaptations`).
"""

from __future__ import annotations

import copy

from torch import nn

from . import adaptations as family


class _HeadOnLastPosition(nn.Module):
    """The causal LM called with ``logits_to_keep=1``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs, logits_to_keep=1)


def with_static_cache(model: nn.Module, max_cache: int, last_logits: bool = False
                      ) -> nn.Module:
    """transformers' exportable module around ``model`` (static cache of ``max_cache`` rows,
    batch 1): ``forward(input_ids, cache_position) -> logits``. Its buffers are the cache; the
    weights are ``model``'s, shared. The model's generation config is the caller's: it is set
    to a static cache only while the adapter is built (the adapter checks it then), then
    restored."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.cache_implementation = "static"
    model.generation_config.use_cache = True
    config = model.config.get_text_config()
    cache_off = family.needs_cache_enabled(model)
    if cache_off:                       # the adapter checks it; the call passes the cache itself
        config.use_cache = True
    try:
        module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1,
                                                       max_cache_len=max_cache).model
    finally:
        model.generation_config = saved
        if cache_off:
            config.use_cache = False
    needs = family.adaptations(model)
    if needs:
        module.model = family.Adapted(module.model, needs, max_cache)
    if last_logits:
        module.model = _HeadOnLastPosition(module.model)
    return module
