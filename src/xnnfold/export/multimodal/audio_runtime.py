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

from pathlib import Path
from typing import Sequence, Union

import torch

from ...pte.runner import method_constant, verified_program
from .audio import AUDIO_ENCODER
from .export import TEXT_DECODER, TOKEN_EMBEDDING
from .runtime import BadInput, MultimodalGenerator, image_runs

AUDIO = "audio"


class AudioGenerator(MultimodalGenerator):
    """An audio-text-to-text .pte (bytes or a path) loaded on the runtime."""

    def __init__(self, pte: Union[bytes, str, Path]):   # not the base's: no image constants
        data = pte if isinstance(pte, (bytes, bytearray)) else Path(pte).read_bytes()
        self._data = bytes(data)              # the loaded program reads from this buffer
        self._program = verified_program(self._data)
        missing = {AUDIO_ENCODER, TOKEN_EMBEDDING, TEXT_DECODER} - set(
            self._program.method_names)
        if missing:
            raise BadInput(f"no {', '.join(sorted(missing))} method: not an audio-text-to-text "
                           ".pte (`xnnfold hf` writes one for a VoxtralForConditionalGeneration)")
        constant = lambda name: method_constant(self._program, name)  # noqa: E731
        self.max_cache = int(constant("get_max_context_len"))
        self.max_prefill = int(constant("get_max_seq_len"))
        self.vocab_size = int(constant("get_vocab_size"))
        self.audio_token = int(constant("get_audio_token_id"))
        self.audio_tokens = int(constant("get_audio_tokens"))
        self.audio_size = tuple(int(s) for s in constant("get_audio_size"))
        eos = method_constant(self._program, "get_eos_ids", [])
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self._methods = {name: self._program.load_method(name)
                         for name in (AUDIO_ENCODER, TOKEN_EMBEDDING, TEXT_DECODER)}

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
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise BadInput("the prompt is empty: give at least one token")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise BadInput(f"token {bad[0]} is outside the vocabulary (0 to "
                           f"{self.vocab_size - 1})")
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
        (embeddings,) = self._methods[AUDIO_ENCODER].execute((features,))
        return embeddings

    def encode(self, kind: str, value: torch.Tensor) -> torch.Tensor:
        return self.encode_audio(value)
