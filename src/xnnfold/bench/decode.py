"""LLM decode measured (``xnnfold bench llm-decode``, issue 29): variants of one decoder LM's
step lowered, checked over 4 steps against eager, timed interleaved per position, with the
memory floor and the portable share.

A *variant* is a road and a partitioner: ``hf-*`` lower transformers' static-cache export
(:func:`xnnfold.bench.models.decoder_lm.transformers_lm`), ``et-*`` executorch's example Llama
(``et-stock``: its LLM flow, custom KV cache and ``llama::custom_sdpa``; ``et-plain-*``: its
plain KV cache and SDPA).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .compare import compare_outputs
from .measure import PteRunner, inspect_lowered
from .models import decoder_lm
from .side_by_side import time_interleaved

CHECK_STEPS = 4


def machine_line() -> str:
    load = os.getloadavg()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
            f"average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, torch "
            f"{torch.__version__}, one thread")


def copy_bandwidth(megabytes: int = 256, reps: int = 7) -> float:
    """Bytes read plus bytes written per second by one thread copying a ``megabytes`` MB fp32
    tensor into another (median of ``reps``; the first copy, which faults pages in, is not
    counted)."""
    source = torch.rand(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return 2 * source.numel() * 4 / statistics.median(times[1:])


@dataclass
class Variant:
    name: str
    lm: decoder_lm.DecoderLM
    pte: bytes
    lower_seconds: float
    delegate_calls: int
    ops_outside: list
    check: str = ""
    runner: Optional[PteRunner] = None
    kernels: str = ""
    explain: list = field(default_factory=list)


def lower_variant(name: str, lm, program, quant: str = "none") -> Variant:
    """Lower ``program`` (one step of ``lm``) with the partitioner ``name`` asks for."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as Stock,
    )
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    from ..partitioner import XnnpackPartitioner

    base = name.split("+")[0]
    if base.endswith("-xnnfold-llm"):
        partitioner = XnnpackPartitioner(llm_kernels=True)
    elif base.endswith("-xnnfold"):
        partitioner = XnnpackPartitioner()
    else:
        partitioner = Stock()
    if quant != "none":
        import executorch.kernels.quantized  # noqa: F401 - the quantized ops' out variants
    from executorch.exir import ExecutorchBackendConfig

    config = EdgeCompileConfig(_check_ir_validity=lm.strict_edge)
    backend = ExecutorchBackendConfig(run_reinplace_pass=name.endswith("+reinplace"))
    start = time.perf_counter()
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner], compile_config=config)
    pte = edge.to_executorch(backend).buffer
    seconds = time.perf_counter() - start
    ops, calls, _, _ = inspect_lowered(edge.exported_program())
    result = getattr(partitioner, "last_result", None)
    notes = [r.describe() for r in getattr(result, "kv_cache", [])] if result else []
    return Variant(name, lm, pte, seconds, calls, ops, kernels=_kernels(ops), explain=notes)


def _kernels(ops: list) -> str:
    custom = sorted({op for op in ops if op.startswith("llama.") or "llama::" in op})
    return ", ".join(custom) if custom else "XNNPACK + portable"


def check_steps(variant: Variant, seed: int = 0) -> str:
    """Run ``CHECK_STEPS`` decode steps from an empty cache on a freshly loaded .pte and on a
    fresh eager module; the worst comparison of the logits."""
    lm = variant.lm.fresh()
    runner = PteRunner(variant.pte)
    generator = torch.Generator().manual_seed(seed)
    worst = None
    for position in range(CHECK_STEPS):
        tokens = torch.randint(0, lm.dims.vocab, (1, 1), generator=generator)
        inputs = lm.step_inputs(tokens, position)
        expected = lm.run(inputs)
        verdict = compare_outputs(runner.run(inputs), expected)
        if worst is None or not verdict.ok or verdict.max_abs_diff > worst.max_abs_diff:
            worst = verdict
        if not verdict.ok:
            break
    return str(worst)


def time_positions(variants: list, positions: list, rounds: int) -> dict:
    """``{(variant, position): median ms}``: each position's step timed interleaved over all
    variants (a fresh runner per variant; the step overwrites the same cache row each call)."""
    medians = {}
    for position in positions:
        runners = {v.name: v.runner for v in variants}
        inputs = {v.name: v.lm.step_inputs(torch.tensor([[1]]), position) for v in variants}
        for name, times in _interleaved(runners, inputs, rounds).items():
            medians[(name, position)] = statistics.median(times)
    return medians


def _interleaved(runners: dict, inputs: dict, rounds: int) -> dict:
    class Bound:
        def __init__(self, runner, args):
            self.runner, self.args = runner, args

        def run(self, _):
            return self.runner.run(self.args)

    bound = {name: Bound(runner, inputs[name]) for name, runner in runners.items()}
    return time_interleaved(bound, (), rounds)


def portable_share(variant: Variant, position: int) -> tuple:
    """(ms on portable, % of the step, top portable ops) from an ETDump of a few steps."""
    from .devtools import DELEGATE, operator_times

    inputs = variant.lm.step_inputs(torch.tensor([[1]]), position)
    ops = operator_times(variant.pte, inputs, runs=5)
    total = sum(ops.values())
    portable = total - ops.get(DELEGATE, 0.0)
    top = [(k, round(v, 3)) for k, v in ops.items() if k != DELEGATE][:4]
    return portable, 100 * portable / total if total else 0.0, top


def memory_floor_ms(dims, position: int, bandwidth: float, tied: bool = False) -> float:
    """Bytes one step must read — the weights and the cache rows up to ``position`` — at the
    measured copy bandwidth."""
    read = decoder_lm.weight_bytes_read(dims, tied) + \
        decoder_lm.cache_bytes_read(dims, position + 1)
    return 1e3 * read / bandwidth


def build(road: str, dims, arch: str = "llama"):
    if road == "hf":
        return decoder_lm.transformers_lm(arch, dims)
    if road == "et":
        return decoder_lm.executorch_llama(dims, custom=True)
    return decoder_lm.executorch_llama(dims, custom=False)


def road_of(variant: str) -> str:
    return "et-plain" if variant.startswith("et-plain") else variant.split("-")[0]


def run_size(hidden: int, cache: int, args, names: list, bandwidth: float) -> None:
    dims = decoder_lm.Dims.for_hidden(hidden, cache, args.layers, args.vocab)
    positions = [p for p in (int(x) for x in args.positions.split(",")) if p < cache]
    print(f"\n## hidden {dims.hidden}, {dims.layers} layers, {dims.heads} heads, "
          f"{dims.kv_heads} KV heads, vocab {dims.vocab:,}, cache {cache:,}, MLP {dims.mlp}",
          flush=True)
    programs, lms, variants = {}, {}, []
    for name in names:
        road = road_of(name)
        if road not in lms:
            lms[road] = build(road, dims, args.arch)
            start = time.perf_counter()
            programs[road] = lms[road].export(tokens=1, position=0)
            print(f"exported {lms[road].name} in {time.perf_counter() - start:.1f} s", flush=True)
        variant = lower_variant(name, lms[road], programs[road], args.quant)
        variant.check = check_steps(variant)
        variant.runner = PteRunner(variant.pte)
        variants.append(variant)
        print(f"{name:18s} lowered in {variant.lower_seconds:5.1f} s, .pte "
              f"{len(variant.pte):,} B, {variant.delegate_calls} delegate calls, "
              f"{len(variant.ops_outside)} ops outside, kernels: {variant.kernels}; "
              f"{CHECK_STEPS} steps vs eager: {variant.check}", flush=True)
        for note in variant.explain[:3]:
            print(f"    {note}")
    medians = time_positions(variants, positions, args.rounds)
    base = "et-stock" if "et-stock" in names else names[0]
    print(f"\n| variant | position | decode step (median of {args.rounds}) | vs {base} | "
          f"vs memory floor | on portable (ETDump) | top portable ops (ms) |")
    print("|---|---|---|---|---|---|---|")
    for position in positions:
        floor = memory_floor_ms(dims, position, bandwidth)
        for variant in variants:
            ms = medians[(variant.name, position)]
            share = "" if args.no_etdump else \
                "{:.2f} ms ({:.1f}%) | {}".format(*portable_share(variant, position))
            print(f"| {variant.name} | {position} | {ms:.2f} ms | "
                  f"{ms / medians[(base, position)]:.2f}x | {ms / floor:.2f}x "
                  f"({floor:.2f} ms) | {share} |", flush=True)
