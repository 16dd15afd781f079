"""Greedy generation with an encoder-decoder .pte (:mod:`.export`) on the ExecuTorch runtime,
through the calls executorch's speech runner makes (``extension/asr/runner/seq2seq_runner.cpp``):
``encoder`` once on the input; then ``text_decoder(token (1, 1), the encoder's output as it
came out, cache_position (1,))`` once per token from position 0, the prompt's tokens included.
A runner written for that contract (optimum-executorch's Whisper .pte) runs this .pte, and this
loop runs optimum's.

The program is loaded with ``executorch.runtime.Runtime`` and its .ptd (``<name>.ptd`` beside
the .pte, when there is one). Needs torch and executorch only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from ...pte.runner import method_constant, verified_program
from .export import DECODER, ENCODER


class NotASeq2SeqProgram(ValueError):
    """The .pte has no ``encoder`` / ``text_decoder`` methods (one line naming what it has)."""


@dataclass
class Generated:
    """What one greedy run produced and how long each call took."""

    prompt: list
    tokens: list                    # the generated ones: without the prompt and the end token
    encoder_seconds: float
    step_seconds: list = field(default_factory=list)   # one per decoder call, prompt included
    stopped_at_eos: bool = False

    def summary(self) -> str:
        lines = [f"prompt: {','.join(str(t) for t in self.prompt)}",
                 f"generated {len(self.tokens)} token(s)"
                 f"{' (stopped at the end token)' if self.stopped_at_eos else ''}: "
                 f"{','.join(str(t) for t in self.tokens)}",
                 f"encoder: {self.encoder_seconds * 1e3:.1f} ms"]
        steps = sorted(self.step_seconds)
        if steps:
            lines.append(f"decoder: {len(steps)} call(s) in {sum(steps) * 1e3:.1f} ms; per "
                         f"token median {steps[len(steps) // 2] * 1e3:.2f} ms (min "
                         f"{steps[0] * 1e3:.2f}, max {steps[-1] * 1e3:.2f})")
        return "\n".join(lines)


class Seq2SeqProgram:
    """An encoder-decoder .pte loaded on the runtime; ``data``: its .ptd (default:
    ``<pte stem>.ptd`` beside it, if that exists)."""

    def __init__(self, pte: Union[str, Path], data: Union[str, Path, None] = None):
        pte = Path(pte)
        if data is None and pte.with_suffix(".ptd").is_file():
            data = pte.with_suffix(".ptd")
        self.data = None if data is None else Path(data)
        self._program = verified_program(pte, data)
        methods = set(self._program.method_names)
        if not {ENCODER, DECODER} <= methods:
            raise NotASeq2SeqProgram(f"no encoder and text_decoder methods (it has: "
                                     f"{', '.join(sorted(methods))})")
        self.start = method_constant(self._program, "decoder_start_token_id")
        eos = method_constant(self._program, "get_eos_ids", [])
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.max_cache = int(method_constant(self._program, "get_max_seq_len", 0)) or None
        inputs = self._program.metadata(ENCODER).input_tensor_meta(0)
        self.input_sizes = tuple(inputs.sizes())    # Whisper: (1, mels, frames)
        self.speech = inputs.dtype() == 6           # float features (ScalarType Float), not ids
        self._encoder = self._program.load_method(ENCODER)
        self._decoder = self._program.load_method(DECODER)

    def encode(self, inputs: torch.Tensor) -> torch.Tensor:
        """The ``encoder`` method's one output."""
        (out,) = self._encoder.execute((inputs,))
        return out

    def step(self, token: int, encoded: torch.Tensor, position: int) -> torch.Tensor:
        """The logits ``(V,)`` after ``token`` at ``position``: one ``text_decoder`` call."""
        if position < 0 or (self.max_cache is not None and position >= self.max_cache):
            raise ValueError(f"position {position} is outside the decoder's cache (0 to "
                             f"{(self.max_cache or 1) - 1})")
        (logits,) = self._decoder.execute((torch.tensor([[token]], dtype=torch.long), encoded,
                                           torch.tensor([position], dtype=torch.long)))
        return logits.reshape(-1)

    def generate(self, inputs: torch.Tensor, max_new: int, prompt: Optional[Sequence] = None,
                 processors=None, stop_at_eos: bool = True) -> Generated:
        """Greedy tokens after ``prompt`` (default: the .pte's start token). ``processors``
        (see :class:`~.whisper.WhisperPrompt`): ``processors(logits, position, prompt_length)``
        on each generated step's logits, and ``processors.fill(logits, position)`` for a
        ``None`` in the prompt (decided from the logits of the step before it)."""
        if max_new < 1:
            raise ValueError(f"max_new {max_new}: generate at least one token")
        prompt = list(prompt) if prompt is not None else [self.start]
        if prompt[0] is None:
            raise ValueError("no start token: give a prompt (the .pte names no "
                             "decoder_start_token_id)")
        needed = len(prompt) - 1 + max_new
        if self.max_cache is not None and needed > self.max_cache:
            raise ValueError(f"{len(prompt)} prompt token(s) and {max_new} new need {needed} "
                             f"decoder positions; this .pte's cache has {self.max_cache}")
        start = time.perf_counter()
        encoded = self.encode(inputs)
        run = Generated(prompt, [], time.perf_counter() - start)
        sequence = [prompt[0]]
        for position in range(needed):
            start = time.perf_counter()
            logits = self.step(sequence[-1], encoded, position)
            run.step_seconds.append(time.perf_counter() - start)
            if position + 1 < len(prompt):
                if prompt[position + 1] is None:
                    prompt[position + 1] = processors.fill(logits, position + 1)
                sequence.append(prompt[position + 1])
                continue
            if processors is not None:
                logits = processors(logits, position + 1, len(prompt))
            token = int(logits.argmax())
            if stop_at_eos and token in self.eos_ids:
                run.stopped_at_eos = True
                break
            run.tokens.append(token)
            sequence.append(token)
        return run
