"""Greedy generation with an image-text-to-text .pte (:mod:`.export`) on the ExecuTorch runtime,
calling its methods as executorch's ``MultimodalRunner`` does: the prompt's token ids cut at
each run of the image token, every text piece through ``token_embedding``, every image through
``vision_encoder``, each piece's embeddings into ``text_decoder`` at the next positions (an
image's in one call, as the runner; a text piece longer than ``max_prefill`` in chunks, where
the runner would fail), then one token per call. At temperature 0 both pick the largest logit,
the first one on a tie.

What the runner does not check is checked here, one line each (:class:`BadInput`): an image
of another size or channels than the vision encoder's, a run of image tokens of another length
than an image's embeddings, more (or fewer) runs than images.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence, Union

import torch

from ...pte.runner import method_constant, verified_program
from ..llm.runtime import Generation, decode
from ..llm.sampling import GREEDY
from .export import TEXT_DECODER, TOKEN_EMBEDDING, VISION_ENCODER


class BadInput(ValueError):
    """An image or prompt this .pte cannot take: one line naming the problem."""


def image_runs(tokens: Sequence[int], image_token: int) -> list:
    """(start, end) of each run of ``image_token`` in ``tokens``, ``end`` exclusive."""
    runs, start = [], None
    for index, token in enumerate(list(tokens) + [None]):
        if token == image_token and start is None:
            start = index
        elif token != image_token and start is not None:
            runs.append((start, index))
            start = None
    return runs


def cut(tokens: Sequence[int], runs: Sequence, images: Sequence) -> list:
    """("tokens", ids) and ("image", image) in prompt order: ``tokens`` cut at ``runs`` (of
    :func:`image_runs`), each run replaced by its image (as many as runs)."""
    pieces, position = [], 0
    for (start, end), image in zip(runs, images):
        if start > position:
            pieces.append(("tokens", list(tokens[position:start])))
        pieces.append(("image", image))
        position = end
    if position < len(tokens):
        pieces.append(("tokens", list(tokens[position:])))
    return pieces


class MultimodalGenerator:
    """An image-text-to-text .pte (bytes or a path) loaded on the runtime; a subclass for
    another kind of input names its encoder method, its kind (the .pte's ``get_<kind>_token_id``,
    ``get_<kind>_tokens``, ``get_<kind>_size`` constants) and its attributes for them."""

    ENCODER, KIND = VISION_ENCODER, "image"
    WHAT = ("an image-text-to-text .pte (`xnnfold hf` writes one for a "
            "LlavaForConditionalGeneration or a SmolVLMForConditionalGeneration)")

    def __init__(self, pte: Union[bytes, str, Path]):
        data = pte if isinstance(pte, (bytes, bytearray)) else Path(pte).read_bytes()
        self._data = bytes(data)              # the loaded program reads from this buffer
        self._program = verified_program(self._data)
        methods = (self.ENCODER, TOKEN_EMBEDDING, TEXT_DECODER)
        missing = set(methods) - set(self._program.method_names)
        if missing:
            raise BadInput(f"no {', '.join(sorted(missing))} method: not {self.WHAT}")
        constant = lambda name: method_constant(self._program, name)  # noqa: E731
        self.max_cache = int(constant("get_max_context_len"))
        self.max_prefill = int(constant("get_max_seq_len"))
        self.vocab_size = int(constant("get_vocab_size"))
        self._input_constants(int(constant(f"get_{self.KIND}_token_id")),
                              int(constant(f"get_{self.KIND}_tokens")),
                              tuple(int(s) for s in constant(f"get_{self.KIND}_size")))
        eos = method_constant(self._program, "get_eos_ids", [])
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self._methods = {name: self._program.load_method(name) for name in methods}

    def _input_constants(self, token: int, tokens: int, size: tuple) -> None:
        self.image_token, self.image_tokens, self.image_size = token, tokens, size

    def check_image(self, pixel_values) -> torch.Tensor:
        """``pixel_values`` as the vision encoder takes it, (1, C, H, W) float32 (one image
        given as (C, H, W) or (1, C, H, W)), else :class:`BadInput`."""
        wanted = " x ".join(str(s) for s in self.image_size)
        if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point():
            raise BadInput(f"the image is not a float tensor (this .pte takes one image of "
                           f"{wanted}, channels x height x width)")
        image = pixel_values.unsqueeze(0) if pixel_values.dim() == 3 else pixel_values
        if tuple(image.shape) != (1, *self.image_size):
            raise BadInput(f"an image of shape {tuple(pixel_values.shape)}: this .pte's vision "
                           f"encoder takes one image of {wanted} (channels x height x width)")
        return image.to(torch.float32).contiguous()

    def checked_tokens(self, tokens: Sequence[int]) -> list:
        """``tokens`` as ints, else :class:`BadInput`: an empty prompt, a token outside the
        vocabulary."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise BadInput("the prompt is empty: give at least one token")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise BadInput(f"token {bad[0]} is outside the vocabulary (0 to "
                           f"{self.vocab_size - 1})")
        return tokens

    def pieces(self, tokens: Sequence[int], images: Sequence) -> list:
        """The prompt as the runner's inputs: ("tokens", ids) and ("image", pixel_values), in
        order; :class:`BadInput` for images and image tokens that do not match."""
        tokens = self.checked_tokens(tokens)
        runs = image_runs(tokens, self.image_token)
        if len(runs) != len(images):
            raise BadInput(f"the prompt has {len(runs)} image(s) (runs of image token "
                           f"{self.image_token}) and {len(images)} image(s) are given")
        wrong = [end - start for start, end in runs if end - start != self.image_tokens]
        if wrong:
            raise BadInput(f"a run of {wrong[0]} image tokens ({self.image_token}): an image "
                           f"is {self.image_tokens} of them")
        return cut(tokens, runs, [self.check_image(image) for image in images])

    def embed(self, tokens: Sequence[int]) -> torch.Tensor:
        (embeddings,) = self._methods[TOKEN_EMBEDDING].execute(
            (torch.tensor([list(tokens)], dtype=torch.long),))
        return embeddings

    def encode(self, kind: str, value: torch.Tensor) -> torch.Tensor:
        """The embeddings of a piece that is not tokens (this .pte's kind) from its encoder."""
        (embeddings,) = self._methods[self.ENCODER].execute((value,))
        return embeddings

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        return self.encode(self.KIND, image)

    def decode(self, embeddings: torch.Tensor, start: int) -> torch.Tensor:
        """``embeddings`` (1, T, hidden) into the cache from ``start``; the last one's logits,
        (1, V)."""
        length = int(embeddings.shape[1])
        (logits,) = self._methods[TEXT_DECODER].execute(
            (embeddings.contiguous(), torch.arange(start, start + length, dtype=torch.long)))
        return logits.reshape(1, -1)

    def prefill(self, pieces: list) -> tuple:
        """(the last position's logits, the positions written)."""
        position, logits = 0, None
        for kind, value in pieces:
            embeddings = self.embed(value) if kind == "tokens" else self.encode(kind, value)
            chunk = self.max_prefill if kind == "tokens" else int(embeddings.shape[1])
            for offset in range(0, int(embeddings.shape[1]), chunk):
                part = embeddings[:, offset:offset + chunk]
                logits = self.decode(part, position)
                position += int(part.shape[1])
        return logits, position

    def generate(self, tokens: Sequence[int], images: Sequence, max_new: int,
                 stop_at_eos: bool = True, keep_logits: bool = False) -> Generation:
        """Greedy: ``max_new`` tokens after the prompt ``tokens`` whose runs of the image token
        take ``images`` in order (fewer at an EOS id the .pte names, unless ``stop_at_eos`` is
        False)."""
        if max_new < 1:
            raise BadInput(f"max_new {max_new}: generate at least one token")
        pieces = self.pieces(tokens, images)
        if len(tokens) + max_new - 1 > self.max_cache:
            raise BadInput(f"{len(tokens)} prompt token(s) and {max_new} new one(s) need "
                           f"{len(tokens) + max_new - 1} cache rows; this .pte has "
                           f"{self.max_cache}")
        pick = GREEDY.picker()
        start = time.perf_counter()
        logits, position = self.prefill(pieces)
        prefill_seconds = time.perf_counter() - start
        return decode([int(t) for t in tokens], logits, prefill_seconds,
                      lambda token, at: self.decode(self.embed([token]), at), pick, max_new,
                      self.eos_ids if stop_at_eos else (), keep_logits, position)
