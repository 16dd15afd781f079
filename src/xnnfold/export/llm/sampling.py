"""How ``xnnfold generate`` picks each next token from its logits: greedy, or sampled with a
temperature and top-p (nucleus sampling) from a seeded generator, at a cost beside a decode
step's that stays small.

Why not executorch's ``TextLLMRunner``, which samples in C++: its ``GenerationConfig`` takes a
temperature only; each token's sampler is made with top-p 0.9 and seeded with the current
second (``Sampler(vocab_size, temperature)`` in ``TextDecoderRunner::logits_to_token``), so it
can give neither the top-p nor the seeded, repeatable run asked for here.

Why not torch: sorting a 32k vocabulary to find the nucleus costs more than a small model's
decode step, and torch's operators wake its intra-op threads, which then spin on the cores
XNNPACK's threads decode on (measured on a 2-core machine: a sampled decode step 1.4x a greedy
one, the sampling not even timed). So the picking is NumPy's, single-threaded, and finds the
nucleus without sorting the vocabulary: the tokens go into buckets of their probability (its
float32 exponent, one pass), the buckets' masses summed from the likeliest give the bucket where
top-p is reached, and only that bucket's tokens are sorted. A draw picks a bucket by its mass,
then a token within it by its weight: each token's probability is its weight over the
nucleus's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy

# a token's bucket: its weight's float32 bits (the weight is at most 1, so never negative) but
# the lowest 19, i.e. the exponent and 4 bits of the mantissa: buckets 1/16 of an octave wide,
# in the weights' order
_BUCKET_SHIFT = 19


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked from its logits: the largest (``temperature`` 0, greedy,
    as the runner at temperature 0: the first of a tie), or drawn from
    ``softmax(logits / temperature)`` restricted to the most likely tokens whose probabilities
    sum to ``top_p`` (each token whose likelier ones sum to less than ``top_p``), by a NumPy
    generator seeded with ``seed``. ``vocabulary``: pick among the first that many ids only
    (the tokenizer's, as the runner does: an id past it has no text)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    vocabulary: Optional[int] = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature {self.temperature}: expected 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p}: expected more than 0, at most 1")
        if self.vocabulary is not None and self.vocabulary < 1:
            raise ValueError(f"vocabulary {self.vocabulary}: at least 1 token")

    def picker(self):
        """A function ``logits (1, V) -> token id`` for one generation (its own generator)."""
        rng = numpy.random.default_rng(self.seed)
        # a temperature whose inverse is beyond float32 leaves the top token alone: greedy
        # (computed with it, the top token's weight would be 0 * inf)
        greedy = self.temperature * float(numpy.finfo(numpy.float32).max) < 1

        def pick(logits) -> int:
            row = logits.reshape(-1)[:self.vocabulary]
            if not isinstance(row, numpy.ndarray):         # a torch tensor: a view, no copy
                row = row.float().numpy()
            if greedy:
                return int(row.argmax())
            return _draw(row, self.temperature, self.top_p, rng)
        return pick


def _draw(row: numpy.ndarray, temperature: float, top_p: float, rng) -> int:
    top = row.max()
    if not numpy.isfinite(top):
        raise ValueError(f"the logits' largest is {top}: nothing to sample from")
    # each token's probability times a constant: 1 for the top token
    weights = row - top
    with numpy.errstate(over="ignore"):        # -inf at a tiny temperature: a weight of 0
        weights *= numpy.float32(1.0 / temperature)
    numpy.exp(weights, out=weights)
    bucket = weights.view(numpy.int32) >> _BUCKET_SHIFT
    mass = numpy.bincount(bucket, weights=weights)[::-1]     # the likeliest bucket first
    reached = numpy.cumsum(mass)
    last = len(mass) - 1                                     # the top token's bucket
    end = len(mass)
    if top_p < 1:
        target = top_p * reached[-1]
        end = min(int(numpy.searchsorted(reached, target)), last)   # where top-p is reached
        before = reached[end - 1] if end else 0.0
        members = numpy.flatnonzero(bucket == last - end)
        members = members[numpy.argsort(-weights[members], kind="stable")]
        reach = before + numpy.cumsum(weights[members], dtype=numpy.float64)
        kept = min(int(numpy.searchsorted(reach, target)) + 1, len(members))
        coin = rng.random() * reach[kept - 1]
        if coin >= before:                     # one of that bucket's kept tokens
            at = int(numpy.searchsorted(reach[:kept], coin, side="right"))
            return int(members[min(at, kept - 1)])
    else:
        coin = rng.random() * reached[-1]
    # a bucket wholly in the nucleus, by its mass; then a token in it by its weight
    rank = int(numpy.searchsorted(reached[:end], coin, side="right"))
    if rank >= end:                            # rounding at the very top of the range
        rank = int(numpy.flatnonzero(mass[:end])[-1])
    members = numpy.flatnonzero(bucket == last - rank)
    local = numpy.cumsum(weights[members], dtype=numpy.float64)
    at = int(numpy.searchsorted(local, coin - (reached[rank - 1] if rank else 0.0),
                                side="right"))
    return int(members[min(at, len(members) - 1)])


GREEDY = Sampling()
