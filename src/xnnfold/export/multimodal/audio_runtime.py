"""Greedy generation with an audio-text-to-text .pte (:mod:`.audio`) on the ExecuTorch runtime,
calling its methods as executorch's ``MultimodalRunner`` does with an ``Audio`` input: the
prompt cut at each run of the audio token, every text piece through ``token_embedding``, every
audio through ``audio_encoder``, each piece's embeddings into ``text_decoder`` at the next
positions (an audio's in one call), then one token per call
(:class:`~xnnfold.export.multimodal.runtime.MultimodalGenerator`'s prefill and decode).

What the runner does not check is checked here, one line each
(:class:`~xnnfold.export.multimodal.runtime.BadInput`): features of another number of mel bins
or frames than the audio encoder's, a run of audio tokens that is not a whole number of
chunks' embeddings, audio tokens for more (or fewer) chunks than given. A long audio's chunks
(the processor's ``input_features`` (chunks, n_bins, n_frames), one run of their audio tokens)
are encoded one by one, as the runner does with one ``Audio`` input per chunk (given all in
one, it would pass the batch to the one-chunk method, which the runtime refuses).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .audio import AUDIO_ENCODER
from .runtime import BadInput, MultimodalGenerator, image_runs

AUDIO = "audio"


class AudioGenerator(MultimodalGenerator):
    """An audio-text-to-text .pte (bytes or a path) loaded on the runtime."""

    ENCODER, KIND = AUDIO_ENCODER, AUDIO
    WHAT = ("an audio-text-to-text .pte (`xnnfold hf` writes one for a "
            "VoxtralForConditionalGeneration)")

    def _input_constants(self, token: int, tokens: int, size: tuple) -> None:
        self.audio_token, self.audio_tokens, self.audio_size = token, tokens, size

    def chunks(self, features) -> list:
        """``features`` as the audio encoder takes them: one (1, n_bins, n_frames) float32
        tensor per chunk (given as (n_bins, n_frames) or (chunks, n_bins, n_frames), the
        processor's ``input_features``), else :class:`BadInput`."""
        bins, frames = self.audio_size
        wanted = f"chunks of {bins} mel bins x {frames} frames"
        if not isinstance(features, torch.Tensor) or not features.is_floating_point():
            raise BadInput(f"the audio is not a float tensor (this .pte takes {wanted}: the "
                           "processor's input_features)")
        batch = features.unsqueeze(0) if features.dim() == 2 else features
        if batch.dim() != 3 or tuple(batch.shape[1:]) != (bins, frames) or not len(batch):
            raise BadInput(f"audio features of shape {tuple(features.shape)}: this .pte's "
                           f"audio encoder takes {wanted}")
        return [chunk.unsqueeze(0).to(torch.float32).contiguous() for chunk in batch]

    def pieces(self, tokens: Sequence[int], audios: Sequence) -> list:
        """The prompt as the runner's inputs: ("tokens", ids) and ("audio", one chunk), in
        order; a run of k times N audio tokens takes the next k chunks of ``audios`` (as
        transformers places a long audio's chunks, one after the other); :class:`BadInput`
        for audios and audio tokens that do not match."""
        tokens = self.checked_tokens(tokens)
        runs = image_runs(tokens, self.audio_token)
        each = self.audio_tokens
        wrong = [end - start for start, end in runs if (end - start) % each]
        if wrong:
            raise BadInput(f"a run of {wrong[0]} audio tokens ({self.audio_token}): a chunk "
                           f"of audio is {each} of them")
        chunks = [chunk for audio in audios for chunk in self.chunks(audio)]
        taken = sum((end - start) // each for start, end in runs)
        if taken != len(chunks):
            raise BadInput(f"the prompt's audio tokens take {taken} chunk(s) of audio ({each} "
                           f"audio tokens {self.audio_token} each) and {len(chunks)} chunk(s) "
                           "are given")
        pieces, position, left = [], 0, iter(chunks)
        for start, end in runs:
            if start > position:
                pieces.append(("tokens", tokens[position:start]))
            pieces += [(AUDIO, next(left)) for _ in range((end - start) // each)]
            position = end
        if position < len(tokens):
            pieces.append(("tokens", tokens[position:]))
        return pieces

    def encode_audio(self, features: torch.Tensor) -> torch.Tensor:
        return self.encode(self.KIND, features)
