"""Variants of one program lowered, checked against eager and timed side by side in one
process: what the bench scripts print. (The report does the same per model, with more columns
and each lowering in a process of its own: :mod:`xnnfold.bench.report`.)"""

from __future__ import annotations

import random
import statistics
import time

from .compare import compare_outputs
from .runner import PteRunner


def time_interleaved(runners: dict, inputs: tuple, rounds: int, seed: int = 0,
                     warmup: int = 3) -> dict:
    """``{variant: [ms, ...]}``: ``rounds`` rounds, each variant once per round, in an order
    shuffled every round by a ``random.Random(seed)``."""
    for runner in runners.values():
        for _ in range(warmup):
            runner.run(inputs)
    order, rng = list(runners), random.Random(seed)
    times: dict = {variant: [] for variant in runners}
    for _ in range(rounds):
        rng.shuffle(order)
        for variant in order:
            start = time.perf_counter()
            runners[variant].run(inputs)
            times[variant].append((time.perf_counter() - start) * 1e3)
    return times


def medians_interleaved(subjects: dict, measure, rounds: int, warmup: int = 1,
                        seed: int = 0) -> dict:
    """``{variant: (median, ...)}`` of what ``measure(subject)`` returns (a tuple of ms):
    ``warmup`` untimed rounds, then ``rounds`` rounds, each variant once per round, in an order
    shuffled every round by a ``random.Random(seed)``."""
    samples: dict = {variant: [] for variant in subjects}
    order, rng = list(subjects), random.Random(seed)
    for index in range(warmup + rounds):
        rng.shuffle(order)
        for variant in order:
            measured = measure(subjects[variant])
            if index >= warmup:
                samples[variant].append(measured)
    return {variant: tuple(statistics.median(column) for column in zip(*rows))
            for variant, rows in samples.items()}


def lower_and_time(lowerings: dict, inputs: tuple, expected, rounds: int, prefix: str = "",
                   against: tuple = ("stock",)) -> dict:
    """Lower each variant (``{label: () -> Lowered}``), print its .pte bytes, GEMMs outside,
    lowering seconds and outputs against ``expected``; then time them all interleaved and print
    each median as a ratio to every label in ``against``. Returns ``{label: median ms}``."""
    runners, sizes = {}, {}
    for label, lowering in lowerings.items():
        lowered = lowering()
        runners[label], sizes[label] = PteRunner(lowered.pte), lowered.pte_bytes
        print(f"{prefix}{label:24s} .pte {lowered.pte_bytes:,} bytes, GEMMs outside "
              f"{len(lowered.gemms_outside)}, lowering {lowered.lower_seconds:.1f} s, "
              f"{compare_outputs(runners[label].run(inputs), expected)}", flush=True)
    medians = {label: statistics.median(t)
               for label, t in time_interleaved(runners, inputs, rounds).items()}
    for label, median in medians.items():
        ratios = ", ".join(f"{median / medians[other]:.3f}x {other}" for other in against)
        print(f"{prefix}{label:24s} {median:8.3f} ms median of {rounds} ({ratios}; .pte "
              f"{sizes[label] / sizes[against[0]]:.3f}x {against[0]})", flush=True)
    return medians
