"""A transformers image-text-to-text model to the three methods executorch's
``MultimodalRunner`` calls (its constants.h and multimodal_prefiller.cpp, executorch 1.5.1):

- ``vision_encoder(pixel_values (1, C, H, W) float) -> (1, N, hidden)``: the image's N
  embeddings in the text model's space, as transformers computes them before it places them at
  the image tokens (LLaVA: the vision tower, the hidden states of ``vision_feature_layer``
  without the class token under ``vision_feature_select_strategy="default"``, the projector);
  one image size, the config's;
- ``token_embedding(tokens (1, T) int64) -> (1, T, hidden)``: the text model's lookup;
- ``text_decoder(embeddings (1, T, hidden), cache_position (T,)) -> logits (1, 1, V)``: the
  text model after its lookup, over transformers' static KV cache, the head on the last
  position: the program of :func:`xnnfold.export.llm.export_causal_lm` with embeddings in
  place of token ids (:func:`~xnnfold.export.static_cache.with_static_cache` takes either),
  ``1 <= T <= max_prefill``.

The runner prefills each input in one ``text_decoder`` call, the image's N embeddings at once
(it does not split a long input into chunks): ``max_prefill`` is at least N, and a text piece
of the prompt longer than ``max_prefill`` fails in the runner. The constant methods are the
text .pte's (:func:`~xnnfold.export.llm.sizes.runner_metadata`). transformers is imported by
the functions that need it.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from ..fake_weights import export_with_fake_weights
from ..llm.export import GenerationPrograms, _named_failures, lower_generation
from ..llm.sizes import runner_metadata, sizes
from ..static_cache import with_static_cache

VISION_ENCODER, TOKEN_EMBEDDING, TEXT_DECODER = "vision_encoder", "token_embedding", \
    "text_decoder"


class LlavaImageEmbeddings(nn.Module):
    """LLaVA's image features as its ``forward`` places them: ``get_image_features`` with the
    config's feature layer and selection strategy, one image, (1, N, hidden)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.model
        self.layer = model.config.vision_feature_layer
        self.strategy = model.config.vision_feature_select_strategy

    def forward(self, pixel_values):
        features = self.model.get_image_features(
            pixel_values, vision_feature_layer=self.layer,
            vision_feature_select_strategy=self.strategy).pooler_output
        return features[0].unsqueeze(0)

    @staticmethod
    def model_pixels(images: torch.Tensor) -> torch.Tensor:
        """``images`` (K, C, H, W) as the model's ``forward`` takes them."""
        return images


class SmolVLMImageEmbeddings(nn.Module):
    """SmolVLM's (idefics3's) features of one image of the config's size, (1, N, hidden): the
    SigLIP vision model over all its patches, the pixel-shuffle connector and projection. Its
    processor cuts an image into such crops plus a global one (or, without splitting, resizes
    it to one); ``get_image_features`` encodes each alone, with every patch attended (one
    image, no padding), and drops an all-zero crop, which a normalized image never is.

    The patches' position ids are computed from the patch mask with ``bucketize``, which is
    not a core ATen op (no executorch lowering takes it): for a full image they do not depend
    on the pixels, so they are read once from transformers' own embeddings (what their
    position lookup receives for an image of this size) and kept as a constant; when they
    are every position in order, the table itself is added (the same values, no lookup)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.vision = model.model.vision_model
        self.connector = model.model.connector
        config = self.vision.config
        self.register_buffer("position_ids", _position_ids(self.vision, config),
                             persistent=False)
        self.in_order = bool(torch.equal(self.position_ids[0], torch.arange(
            self.vision.embeddings.num_positions)))

    def forward(self, pixel_values):
        embeddings = self.vision.embeddings
        patches = embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        table = embeddings.position_embedding
        hidden = patches + (table.weight.unsqueeze(0) if self.in_order else
                            table(self.position_ids))
        hidden = self.vision.encoder(inputs_embeds=hidden).last_hidden_state
        return self.connector(self.vision.post_layernorm(hidden))

    @staticmethod
    def model_pixels(images: torch.Tensor) -> torch.Tensor:
        """``images`` (K, C, H, W) as the model's ``forward`` takes them: (1, K, C, H, W)."""
        return images.unsqueeze(0)


def _position_ids(vision: nn.Module, config) -> torch.Tensor:
    """(1, patches): the ids SmolVLM's vision embeddings look up for a full image of the
    config's size, as they compute them (a hook on their lookup for one call, removed)."""
    size = config.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    patch = config.patch_size
    seen = []
    hook = vision.embeddings.position_embedding.register_forward_hook(
        lambda module, args, output: seen.append(args[0].clone()))
    try:
        with torch.no_grad():
            vision.embeddings(pixel_values=torch.zeros(1, config.num_channels, height, width),
                              patch_attention_mask=torch.ones(
                                  1, height // patch, width // patch, dtype=torch.bool))
    finally:
        hook.remove()
    return seen[0]


# The classes exported: the image embeddings (the runner's vision_encoder), and the attribute
# of ``model.model`` that is the text model. Both text models attend causally over the image's
# tokens (Gemma3's do not: docs/multimodal.md).
_FAMILIES = {"LlavaForConditionalGeneration": (LlavaImageEmbeddings, "language_model"),
             "SmolVLMForConditionalGeneration": (SmolVLMImageEmbeddings, "text_model")}
SUPPORTED = tuple(_FAMILIES)


def image_embeddings(model: nn.Module) -> nn.Module:
    """The module computing one image's embeddings for ``model``, in eval mode."""
    check_supported(model)
    return _FAMILIES[type(model).__name__][0](model).eval()


def check_supported(model: nn.Module) -> None:
    """``ValueError`` (one line) for a class this module does not export."""
    name = type(model).__name__
    if name not in SUPPORTED:
        raise ValueError(f"{name}: no image-text-to-text export for it yet; supported: "
                         f"{', '.join(SUPPORTED)}")


def text_causal_lm(model: nn.Module, text_model: Optional[str] = None) -> nn.Module:
    """The text model of ``model`` as the causal LM of its text config (``...ForCausalLM``),
    built on the meta device and given ``model``'s language model (``model.model``'s
    attribute ``text_model``; by default the image family's) and head: the weights are
    shared, not copied; ``model`` is not changed."""
    from transformers import AutoModelForCausalLM

    config = model.config.get_text_config()
    with torch.device("meta"):
        causal = AutoModelForCausalLM.from_config(config)
    causal.model = getattr(model.model, text_model or _FAMILIES[type(model).__name__][1])
    causal.lm_head = model.lm_head
    left = [name for name, p in causal.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"{type(model).__name__}: {type(causal).__name__}'s {left[0]} is not "
                         "in the model's language model or head")
    causal.generation_config = copy.deepcopy(model.generation_config)
    return causal.eval()


def image_size(model: nn.Module) -> tuple:
    """(channels, height, width) of the one image the vision encoder takes."""
    vision = model.config.vision_config
    size = vision.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return int(getattr(vision, "num_channels", 3)), int(height), int(width)


def export_image_text_to_text(model: nn.Module, max_cache: Optional[int] = None,
                              max_prefill: Optional[int] = None) -> GenerationPrograms:
    """The three methods of ``model`` (in eval mode; a class of :data:`SUPPORTED`) and the
    runner's constant methods (``image_token_id`` among them; ``get_image_tokens``: N,
    ``get_image_size``: (C, H, W)). ``max_prefill`` (default: 128 or the image's N, the
    larger) below N raises ``ValueError`` (one line); a model torch.export cannot take,
    :class:`~xnnfold.export.llm.export.CannotExport`."""
    check_supported(model)
    causal = text_causal_lm(model)
    vision = image_embeddings(model)
    pixels = torch.randn(1, *image_size(model))
    with torch.no_grad():
        tokens_of_image = int(vision(pixels).shape[1])
    generation = export_text_methods(model, causal, tokens_of_image, max_cache, max_prefill,
                                     "an image's")
    with torch.no_grad(), _named_failures(model):
        encoder = export_with_fake_weights(vision, (pixels,), strict=True)
    generation.programs = {VISION_ENCODER: encoder, **generation.programs}
    generation.metadata.update(
        get_image_token_id=int(model.config.image_token_id), get_image_tokens=tokens_of_image,
        get_image_size=list(image_size(model)))
    return generation


def export_text_methods(model: nn.Module, causal: nn.Module, encoded: int,
                        max_cache: Optional[int], max_prefill: Optional[int],
                        what: str) -> GenerationPrograms:
    """``token_embedding`` and ``text_decoder`` of ``causal`` (:func:`text_causal_lm` of
    ``model``) and the text .pte's constant methods. The runner prefills an encoder's
    ``encoded`` embeddings (``what``: whose, for the message) in one call: ``max_prefill``
    (default: 128 or ``encoded``, the larger) below them raises ``ValueError`` (one line),
    before any export."""
    capped: list = []
    asked = max_prefill
    max_cache, max_prefill = sizes(causal, max_cache, max_prefill, capped)
    if asked is None:              # the default prefill grows to take the encoder's output
        max_prefill = min(max(max_prefill, encoded), max_cache)
    if max_prefill < encoded:
        raise ValueError(f"{'max_cache' if asked is None else 'max_prefill'} {max_prefill}: "
                         f"the runner prefills {what} {encoded} embeddings in one call")
    hidden = int(causal.config.hidden_size)
    length = torch.export.Dim("tokens", min=1, max=max_prefill)
    example = min(4, max_prefill)
    with torch.no_grad(), _named_failures(model):
        embedding = export_with_fake_weights(causal.get_input_embeddings(), (
            torch.zeros(1, example, dtype=torch.long),), dynamic_shapes=({1: length},),
            strict=True)
        stepper = with_static_cache(causal, max_cache, last_logits=True)
        decoder = export_with_fake_weights(
            stepper, (), {"inputs_embeds": torch.randn(1, example, hidden),
                          "cache_position": torch.arange(example)},
            dynamic_shapes={"inputs_embeds": {1: length}, "cache_position": {0: length}},
            strict=True)
    return GenerationPrograms({TOKEN_EMBEDDING: embedding, TEXT_DECODER: decoder},
                              runner_metadata(causal, max_cache, max_prefill), max_cache,
                              max_prefill, capped)


def image_text_to_pte(model: nn.Module, max_cache: Optional[int] = None,
                      max_prefill: Optional[int] = None, **partitioner_kwargs) -> bytes:
    """The .pte of :func:`export_image_text_to_text` through xnnfold
    (``partitioner_kwargs``: those of :class:`~xnnfold.XnnpackPartitioner`)."""
    generation = export_image_text_to_text(model, max_cache, max_prefill)
    return lower_generation(generation, partitioner_kwargs=partitioner_kwargs).pte
