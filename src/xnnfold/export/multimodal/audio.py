"""A transformers audio-text-to-text model (Voxtral: a Whisper-like audio encoder, a projector,
a Llama/Mistral text model) to the methods executorch's ``MultimodalRunner`` calls for audio
(its constants.h, multimodal_prefiller.cpp and audio.h, executorch 1.5.1):

- ``audio_encoder(input_features (1, n_bins, n_frames) float) -> (1, N, hidden)``: the
  preprocessed audio as the runner's ``Audio`` holds it (batch, mel bins, frames; the runner
  passes it as given, and prefills the method's first output, ``size(1)`` positions, in one
  ``text_decoder`` call), the embeddings transformers places at the prompt's N audio tokens:
  the audio tower over one chunk of the config's length (Voxtral's encoder takes exactly
  ``2 * max_source_positions`` frames), its states regrouped into the projector's width and
  projected (``get_audio_features``);
- ``token_embedding`` and ``text_decoder``: the image models' (:mod:`.export`), shared.

The constants: the text .pte's, and ``get_audio_token_id``, ``get_audio_tokens`` (N),
``get_audio_size`` (n_bins, n_frames). transformers is imported by the functions that need it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..fake_weights import export_with_fake_weights
from ..llm.export import GenerationPrograms, _named_failures, lower_generation
from .export import export_text_methods, text_causal_lm

AUDIO_ENCODER = "audio_encoder"
# where the audio goes in a prompt's text (`xnnfold generate --audio --prompt`)
AUDIO_MARK = "<audio>"
# The classes exported, and the attribute of ``model.model`` that is the text model.
AUDIO_SUPPORTED = {"VoxtralForConditionalGeneration": "language_model"}


class AudioEmbeddings(nn.Module):
    """Voxtral's audio embeddings as its ``forward`` places them: ``get_audio_features`` of
    one chunk of mel features (1, n_bins, n_frames), (1, N, hidden)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.model

    def forward(self, input_features):
        return self.model.get_audio_features(input_features).pooler_output.unsqueeze(0)


def check_audio_supported(model: nn.Module) -> None:
    """``ValueError`` (one line) for a class this module does not export."""
    name = type(model).__name__
    if name not in AUDIO_SUPPORTED:
        raise ValueError(f"{name}: no audio-text-to-text export for it yet; supported: "
                         f"{', '.join(AUDIO_SUPPORTED)}")


def audio_size(model: nn.Module) -> tuple:
    """(mel bins, frames) of the one chunk the audio encoder takes."""
    audio = model.config.audio_config
    tower = model.model.audio_tower
    frames = audio.max_source_positions * tower.conv1.stride[0] * tower.conv2.stride[0]
    return int(audio.num_mel_bins), int(frames)


def export_audio_text_to_text(model: nn.Module, max_cache: Optional[int] = None,
                              max_prefill: Optional[int] = None) -> GenerationPrograms:
    """The three methods of ``model`` (in eval mode; a class of :data:`AUDIO_SUPPORTED`) and the
    runner's constant methods. ``max_prefill`` (default: 128 or the chunk's N, the larger)
    below N raises ``ValueError`` (one line); a model torch.export cannot take,
    :class:`~xnnfold.export.llm.export.CannotExport`."""
    check_audio_supported(model)
    causal = text_causal_lm(model, AUDIO_SUPPORTED[type(model).__name__])
    audio = AudioEmbeddings(model).eval()
    features = torch.randn(1, *audio_size(model))
    with torch.no_grad():
        tokens_of_audio = int(audio(features).shape[1])
    generation = export_text_methods(model, causal, tokens_of_audio, max_cache, max_prefill,
                                     "an audio chunk's")
    with torch.no_grad(), _named_failures(model):
        encoder = export_with_fake_weights(audio, (features,), strict=True)
    generation.programs = {AUDIO_ENCODER: encoder, **generation.programs}
    generation.metadata.update(
        get_audio_token_id=int(model.config.audio_token_id), get_audio_tokens=tokens_of_audio,
        get_audio_size=list(audio_size(model)))
    return generation


def audio_text_to_pte(model: nn.Module, max_cache: Optional[int] = None,
                      max_prefill: Optional[int] = None, **partitioner_kwargs) -> bytes:
    """The .pte of :func:`export_audio_text_to_text` through xnnfold
    (``partitioner_kwargs``: those of :class:`~xnnfold.XnnpackPartitioner`)."""
    generation = export_audio_text_to_text(model, max_cache, max_prefill)
    return lower_generation(generation, partitioner_kwargs=partitioner_kwargs).pte
