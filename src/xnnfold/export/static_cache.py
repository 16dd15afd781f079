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

The adapter sizes every layer's cache from the config (``num_key_value_heads``, ``head_dim``).
A model whose layers cache something else — DeepSeek-V2/V3's multi-head latent attention caches
its latents, "keys" (1, 1, S, kv_lora_rank) and "values" (1, 1, S, qk_rope_head_dim) — would
write rows of the wrong shape (torch.export fails in ``index_copy_``): each layer is sized
instead from what the model's own dynamic cache holds after one eager step.
"""

from __future__ import annotations

import copy

import torch
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
    _fit_to_model(module, model)
    needs = family.adaptations(model)
    if needs:
        module.model = family.Adapted(module.model, needs, max_cache)
    if last_logits:
        module.model = _HeadOnLastPosition(module.model)
    return module


def _written_shapes(model: nn.Module) -> list:
    """Per layer, the (keys, values) one eager step with transformers' dynamic cache leaves in
    it (None for a layer that caches nothing)."""
    with torch.no_grad():
        cache = model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True).past_key_values
    shapes = []
    for layer in getattr(cache, "layers", []):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        fits = isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and \
            keys.dim() == values.dim() == 4
        shapes.append((keys, values) if fits else None)
    return shapes


def _fit_to_model(module: nn.Module, model: nn.Module) -> None:
    """Re-size each static layer whose (heads, head size) of keys or values differs from what
    the model writes, and register its new buffers under the adapter's names."""
    cache = getattr(module, "static_cache", None) or getattr(module, "cache", None)
    if cache is None:
        return
    for index, (layer, written) in enumerate(zip(cache.layers, _written_shapes(model))):
        if written is None or not getattr(layer, "is_initialized", False):
            continue
        keys, values = written
        if (layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[1],
                layer.values.shape[3]) == (keys.shape[1], keys.shape[3], values.shape[1],
                                           values.shape[3]):
            continue
        layer.lazy_initialization(keys[:, :, :0], values[:, :, :0])
        module.register_buffer(f"key_cache_{index}", layer.keys, persistent=False)
        module.register_buffer(f"value_cache_{index}", layer.values, persistent=False)
