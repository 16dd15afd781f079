"""Generation with a generation-ready .pte (:mod:`xnnfold.export.llm.export`) on the ExecuTorch
runtime, timed: greedy, or sampled with a temperature and top-p from a seeded generator
(:mod:`xnnfold.export.llm.sampling`).

The program's one method, ``forward``, takes a prompt in chunks of at most ``max_prefill``
tokens (each chunk attends to the rows already cached and to itself, causally: what one long
prefill computes) and then one token per call, as executorch's ``TextLLMRunner`` calls it; at
temperature 0 both pick the largest logit, the first one on a tie, so both give the same tokens.
A .pte of the two-method layout xnnfold wrote before (``prefill`` and ``decode``, the cache
shared only by a runtime that shares memory arenas between methods) is refused with one line.
Needs torch and executorch only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from ...pte.runner import load_llm_kernels, method_constant, verified_program
from .export import DECODE, FORWARD, PREFILL
from .sampling import GREEDY, Sampling


# the namespace of executorch's LLM kernels, as a .pte that calls them names its operators
LLM_KERNELS = b"llama::"


def _file_holds(path: str, text: bytes, chunk: int = 1 << 22) -> bool:
    """Whether the file at ``path`` holds ``text``, read a chunk at a time (a .pte of several GB
    is never in memory whole)."""
    with open(path, "rb") as file:
        tail = b""
        while True:
            block = file.read(chunk)
            if not block:
                return False
            if text in tail + block[:len(text) - 1] or text in block:
                return True
            tail = block[-(len(text) - 1):]


class NotAGenerationProgram(ValueError):
    """The .pte is not a generation program xnnfold writes (one line naming what it has)."""


@dataclass
class Generation:
    """The tokens one run produced and how long each phase took."""

    prompt: list
    tokens: list                       # the new tokens, in order
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int                  # one-token calls (the first new token comes from prefill)
    stopped_at_eos: bool = False
    logits: list = field(default_factory=list)   # each new token's logits (1, V), if kept

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds else 0.0

    def summary(self) -> str:
        lines = [f"prompt: {len(self.prompt)} token(s); generated {len(self.tokens)}"
                 f"{' (stopped at EOS)' if self.stopped_at_eos else ''}: "
                 f"{','.join(str(t) for t in self.tokens)}",
                 f"prefill: {len(self.prompt)} token(s) in {self.prefill_seconds * 1e3:.2f} ms "
                 f"({self.prefill_tokens_per_second:,.1f} tokens/s)"]
        if self.decode_steps:
            lines.append(f"decode: {self.decode_steps} step(s) in "
                         f"{self.decode_seconds * 1e3:.2f} ms ({self.decode_tokens_per_second:,.1f}"
                         f" tokens/s, {self.decode_seconds * 1e3 / self.decode_steps:.3f} ms "
                         "per token)")
        else:
            lines.append("decode: no step (one new token comes from prefill)")
        return "\n".join(lines)


def set_threads(threads: int) -> None:
    """The runtime's threads: ``threads`` in its thread pool (XNNPACK's and the portable
    kernels') and in torch's intra-op pool, which executorch's LLM kernels
    (``llama::custom_sdpa``, loaded from the wheel's library built on ATen) split their work
    over in this process (measured: a prefill of 2 tokens with ``custom_sdpa`` took 5 ms with
    one torch thread, 750 ms with torch's default two on a loaded 2-core machine). For every
    program of this process; call it before running, never during a run."""
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    if threads < 1:
        raise ValueError(f"threads {threads}: at least 1")
    _unsafe_reset_threadpool(threads)
    torch.set_num_threads(threads)


class Generator:
    """A generation-ready .pte (bytes or a path) loaded on the runtime. A path is loaded by
    the runtime from the file (mapped, not read into a buffer of this process): after an
    export, the check of a written .pte then holds no second copy of it."""

    def __init__(self, pte: Union[bytes, str, Path]):
        import executorch.kernels.quantized  # noqa: F401 - a quantized .pte's out variants

        if isinstance(pte, (bytes, bytearray)):
            self._data = bytes(pte)           # the loaded program reads from this buffer
            load_llm_kernels(self._data)
        else:
            self._data = str(pte)
            if _file_holds(self._data, LLM_KERNELS):
                load_llm_kernels(LLM_KERNELS)
        self._program = verified_program(self._data)
        methods = set(self._program.method_names)
        if FORWARD not in methods:
            if {PREFILL, DECODE} <= methods:
                raise NotAGenerationProgram(
                    "methods prefill and decode: the two-method layout of an older xnnfold, "
                    "whose cache executorch's runner does not share between them; export it "
                    "again with `xnnfold hf DIR` (one forward method)")
            raise NotAGenerationProgram(
                f"no forward method (it has: {', '.join(sorted(methods))}); write a "
                "generation .pte with `xnnfold hf DIR` on a causal LM")
        self.max_cache = int(method_constant(self._program, "get_max_context_len", 0))
        self.max_prefill = int(method_constant(self._program, "get_max_seq_len", 0))
        self.vocab_size = int(method_constant(self._program, "get_vocab_size", 0))
        eos = method_constant(self._program, "get_eos_ids", [])
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        if self.max_cache < 1 or self.max_prefill < 1 or self.vocab_size < 1:
            raise NotAGenerationProgram("no get_max_context_len / get_max_seq_len / "
                                        "get_vocab_size constants: not a generation .pte")
        self._forward = self._program.load_method(FORWARD)

    def check(self, tokens: Sequence[int], new: int = 0, start: int = 0) -> None:
        """``ValueError`` (one line) unless ``tokens`` at ``start`` and ``new`` generated tokens
        fit this .pte's vocabulary and cache."""
        if not tokens:
            raise ValueError("the prompt is empty: give at least one token")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the vocabulary (0 to "
                             f"{self.vocab_size - 1})")
        end = start + len(tokens) + max(0, new - 1)
        if end > self.max_cache:
            # what the .pte holds, not what was asked: a caller's warm-up asks other sizes
            room = self.max_cache - start - len(tokens) + 1     # the first comes from prefill
            raise ValueError(f"{len(tokens)} prompt token(s) at position {start} " + (
                f"need {start + len(tokens)} cache rows; this .pte has {self.max_cache}"
                if room < 1 else f"leave room for {room} new token(s) in this .pte's "
                f"{self.max_cache} cache rows"))

    def _run(self, tokens: list, first: int) -> torch.Tensor:
        (logits,) = self._forward.execute((
            torch.tensor([tokens], dtype=torch.long),
            torch.arange(first, first + len(tokens), dtype=torch.long)))
        return logits.reshape(1, -1)

    def prefill(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        """Write ``tokens`` into the cache from position ``start``; the last one's logits,
        (1, V). Chunks of at most ``max_prefill`` tokens."""
        self.check(tokens, start=start)
        logits = None
        for offset in range(0, len(tokens), self.max_prefill):
            logits = self._run(list(tokens[offset:offset + self.max_prefill]), start + offset)
        return logits

    def step(self, token: int, position: int) -> torch.Tensor:
        """One token at ``position`` into the cache; its logits, (1, V)."""
        if not 0 <= position < self.max_cache:
            raise ValueError(f"position {position} is outside the cache (0 to "
                             f"{self.max_cache - 1})")
        return self._run([int(token)], position)

    def generate(self, prompt: Sequence[int], max_new: int, stop_at_eos: bool = True,
                 keep_logits: bool = False, sampling: Sampling = GREEDY) -> Generation:
        """``max_new`` tokens after ``prompt`` (fewer at an EOS id the .pte names, unless
        ``stop_at_eos`` is False), picked by ``sampling`` (greedy by default). The cache starts
        at position 0 each time."""
        prompt = [int(t) for t in prompt]
        if max_new < 1:
            raise ValueError(f"max_new {max_new}: generate at least one token")
        self.check(prompt, max_new)
        pick = sampling.picker()
        start = time.perf_counter()
        logits = self.prefill(prompt)
        prefill_seconds = time.perf_counter() - start
        return decode(prompt, logits, prefill_seconds, self.step, pick, max_new,
                      self.eos_ids if stop_at_eos else (), keep_logits)


def decode(prompt: list, logits: torch.Tensor, prefill_seconds: float, step, pick,
           max_new: int, eos_ids=(), keep_logits: bool = False,
           position: Optional[int] = None) -> Generation:
    """The decode loop after a prefill that gave ``logits`` for its last position:
    ``step(token, position)`` gives the next logits, ``pick`` the token, until ``max_new``
    tokens or one of ``eos_ids``; the first step at ``position`` (the prompt's length unless
    given)."""
    tokens, kept, steps, decode_seconds = [], [], 0, 0.0
    position, stopped = len(prompt) if position is None else position, False
    token = pick(logits)
    while True:
        tokens.append(token)
        if keep_logits:
            kept.append(logits)
        if token in eos_ids:
            stopped = True
            break
        if len(tokens) == max_new:
            break
        # a step's time is its call and the pick of its token, as the runner's Stats
        start = time.perf_counter()
        logits = step(token, position)
        token = pick(logits)
        decode_seconds += time.perf_counter() - start
        steps += 1
        position += 1
    return Generation(prompt, tokens, prefill_seconds, decode_seconds, steps, stopped, kept)


def generate(pte: Union[bytes, str, Path], prompt: Sequence[int], max_new: int,
             stop_at_eos: bool = True, sampling: Sampling = GREEDY) -> Generation:
    """Generation with the .pte at ``pte`` (see :class:`Generator`)."""
    return Generator(pte).generate(prompt, max_new, stop_at_eos, sampling=sampling)
