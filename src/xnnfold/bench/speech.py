"""Whisper generation measured (``xnnfold bench whisper``): xnnfold's generation .pte
(:mod:`xnnfold.export.seq2seq`) beside optimum-executorch's ``--task
automatic-speech-recognition --recipe xnnpack`` .pte of the same folder (when given), every
variant driven through the speech runner's calls by one loop
(:class:`~xnnfold.export.seq2seq.Seq2SeqProgram`): a decoder step at one position against the
memory floor (a copy moving as many bytes as the step must read, timed among the steps), the
encoder, a whole transcription; the .pte bytes against the weights; the step's share on
portable kernels (ETDump).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..pte.timing import time_interleaved
from .decode import FLOOR, CopyFloor


@dataclass
class Variant:
    """One .pte loaded, and what a step at the timed position runs with."""

    name: str
    pte: Path
    program: object                       # Seq2SeqProgram
    encoded: Optional[torch.Tensor] = None

    @property
    def files_bytes(self) -> int:
        data = self.program.data
        return self.pte.stat().st_size + (data.stat().st_size if data else 0)


def weight_bytes(model) -> int:
    """The model's parameters, each stored once (a tied table counted once)."""
    seen, total = set(), 0
    for parameter in model.parameters():
        if parameter.data_ptr() not in seen:
            seen.add(parameter.data_ptr())
            total += parameter.numel() * parameter.element_size()
    return total


def step_bytes(model, position: int) -> int:
    """Bytes one decoder step at ``position`` must read: the decoder's weights but the cross
    key/value projections (the encoder ran them) and the embedding tables (one row each), the
    output head's table once, every layer's cross keys and values, and the self-attention
    cache rows up to the position."""
    config, decoder = model.config, model.get_decoder()
    width = config.d_model
    skipped = ("encoder_attn.k_proj", "encoder_attn.v_proj", "embed_tokens", "embed_positions")
    weights = sum(p.numel() for n, p in decoder.named_parameters()
                  if not any(s in n for s in skipped))
    table = decoder.embed_tokens.weight.numel()
    layers = config.decoder_layers
    cross = 2 * layers * config.max_source_positions * width
    cached = 2 * layers * (position + 1) * width
    return 4 * (weights + table + 2 * width + cross + cached)


def prepared(variants: list, features: torch.Tensor, position: int, prompt: list) -> None:
    """Each variant's encoder output, and its cache filled up to ``position``."""
    for variant in variants:
        variant.encoded = variant.program.encode(features).clone()
        for at in range(position):
            variant.program.step(prompt[min(at, len(prompt) - 1)], variant.encoded, at)


class _Step:
    def __init__(self, variant: Variant, position: int, token: int):
        self.variant, self.position, self.token = variant, position, token

    def run(self, _=None):
        self.variant.program.step(self.token, self.variant.encoded, self.position)


class _Encoder:
    def __init__(self, variant: Variant, features: torch.Tensor):
        self.variant, self.features = variant, features

    def run(self, _=None):
        self.variant.program.encode(self.features)


class _Transcription:
    def __init__(self, variant: Variant, features, tokens: int, prompt: list):
        self.variant, self.features, self.tokens, self.prompt = variant, features, tokens, prompt

    def run(self, _=None):
        self.variant.program.generate(self.features, self.tokens, self.prompt, None,
                                      stop_at_eos=False)


def _medians(runners: dict, rounds: int) -> dict:
    return {name: statistics.median(times)
            for name, times in time_interleaved(runners, (), rounds).items()}


def time_steps(variants: list, position: int, token: int, read_bytes: int, rounds: int) -> dict:
    """{variant or FLOOR: median ms} of a decoder step at ``position``, interleaved."""
    runners = {v.name: _Step(v, position, token) for v in variants}
    runners[FLOOR] = CopyFloor(read_bytes)
    return _medians(runners, rounds)


def time_encoders(variants: list, features: torch.Tensor, rounds: int) -> dict:
    return _medians({v.name: _Encoder(v, features) for v in variants}, rounds)


def time_transcriptions(variants: list, features, tokens: int, prompt: list,
                        rounds: int) -> dict:
    """{variant: median ms} of the encoder and ``tokens`` tokens after ``prompt``, greedy,
    none stopped at an end token."""
    return _medians({v.name: _Transcription(v, features, tokens, prompt) for v in variants},
                    rounds)


def portable_share(variant: Variant, position: int, token: int) -> str:
    """Where a decoder step's time outside XNNPACK goes (ETDump): ms and % on portable kernels,
    and the top ops."""
    from ..pte.devtools import DELEGATE, operator_times

    data = variant.program.data.read_bytes() if variant.program.data else None
    inputs = (torch.tensor([[token]]), variant.encoded, torch.tensor([position]))
    ops = operator_times(variant.pte.read_bytes(), inputs, runs=5, method="text_decoder",
                         data=data)
    total = sum(ops.values()) or 1.0
    portable = total - ops.get(DELEGATE, 0.0)
    top = " / ".join(f"{k} {v:.3f}" for k, v in list(ops.items())[:6] if k != DELEGATE)
    return f"{portable:.3f} ms of {total:.2f} ({100 * portable / total:.1f}%): {top}"
