"""LLM decode measured (``xnnfold bench llm-decode``): variants of one decoder LM's
step lowered, checked over 4 steps against eager, timed interleaved per position, with the
memory floor and the portable share.

A *variant* is a road and a partitioner: ``hf-*`` lower transformers' static-cache export
(:func:`xnnfold.models.decoder_lm.transformers_lm`), ``et-*`` executorch's example Llama
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

from ..pte.compare import compare_outputs
from ..pte import PteRunner, inspect_lowered
from ..models import decoder_lm
from ..pte.timing import time_interleaved

CHECK_STEPS = 4


def one_thread() -> None:
    """One thread for torch and for the runtime: the wheel's runtime has a thread pool of its
    own (XNNPACK's and the custom ops' parallel loops), sized to the cores, which
    ``torch.set_num_threads`` does not touch."""
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    portable_lib._unsafe_reset_threadpool(1)


def machine_line() -> str:
    from executorch.extension.pybindings import portable_lib

    load = os.getloadavg()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
            f"average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, torch "
            f"{torch.__version__}, threads: torch {torch.get_num_threads()}, runtime "
            f"{portable_lib._threadpool_get_thread_count()}")


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
    elif base.endswith("-stock-flag"):
        partitioner = Stock(force_non_static_weights_for_f32_linear=True)
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


# Dynamic int8 activations: XNNPACK's integer kernels against the eager reference's fp32
# simulation of them differ by a few hundredths in the logits (stock's .pte as much as
# xnnfold's): the check is then that every variant stays within that.
QUANT_ATOL = {"none": None, "int8": 5e-2, "8da4w": 1e-1, "pt2e-int8": 5e-2}


def check_steps(variant: Variant, seed: int = 0, tokens: int = 1, atol=None) -> str:
    """Run ``CHECK_STEPS`` steps of ``tokens`` tokens each (as many as the cache holds) from an
    empty cache on a freshly loaded .pte and on a fresh eager module; the worst comparison of
    the logits."""
    lm = variant.lm.fresh()
    runner = PteRunner(variant.pte)
    generator = torch.Generator().manual_seed(seed)
    worst = None
    for step in range(min(CHECK_STEPS, lm.dims.cache // tokens)):
        ids = torch.randint(0, lm.dims.vocab, (1, tokens), generator=generator)
        inputs = lm.step_inputs(ids, step * tokens)
        expected = lm.run(inputs)
        # fp32 logits at their rows' scale, as every generation check judges them (an
        # element's own 1e-4 called stock's and xnnfold's correct Gemma2 WRONG)
        how = {"per_row": True} if atol is None else {"atol": atol}
        verdict = compare_outputs(runner.run(inputs), expected, **how)
        if worst is None or not verdict.ok or verdict.max_abs_diff > worst.max_abs_diff:
            worst = verdict
        if not verdict.ok:
            break
    return str(worst)


FLOOR = "memory floor"


class CopyFloor:
    """The memory floor of a step, timed beside it: one thread moving (reading plus writing) as
    many bytes as the step must read — a torch copy of half that many bytes."""

    def __init__(self, read_bytes: int):
        self.source = torch.rand(read_bytes // 8)
        self.target = torch.empty_like(self.source)

    def run(self, _=None):
        self.target.copy_(self.source)


def time_positions(variants: list, positions: list, rounds: int, tokens: int = 1,
                   floors: Optional[dict] = None) -> dict:
    """``{(variant, position): median ms}``: each position's step (of ``tokens`` tokens) timed
    interleaved over all variants (the step overwrites the same cache rows each call), and
    ``floors`` ({position: bytes the step reads}) timed among them as :class:`CopyFloor`."""
    medians = {}
    for position in positions:
        runners = {v.name: v.runner for v in variants}
        ids = torch.ones(1, tokens, dtype=torch.long)
        inputs = {v.name: v.lm.step_inputs(ids, position) for v in variants}
        if floors:
            runners[FLOOR], inputs[FLOOR] = CopyFloor(floors[position]), ()
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


def outside_delegates(variant: Variant, position: int, tokens: int = 1) -> str:
    """Where the step's time outside XNNPACK goes, from an ETDump of a few steps: portable
    kernels and executorch's custom (``llama::``) kernels, each in ms and % of the ETDump's
    total, and the top ops."""
    from ..pte.devtools import DELEGATE, operator_times

    inputs = variant.lm.step_inputs(torch.ones(1, tokens, dtype=torch.long), position)
    ops = operator_times(variant.pte, inputs, runs=5)
    total = sum(ops.values()) or 1.0
    custom = sum(v for k, v in ops.items() if "::" in k)
    portable = total - ops.get(DELEGATE, 0.0) - custom
    top = ", ".join(f"{k} {v:.3f}" for k, v in ops.items() if k != DELEGATE and v >= 0.0005)
    return (f"{portable:.2f} ms ({100 * portable / total:.1f}%) | {custom:.2f} ms "
            f"({100 * custom / total:.1f}%) | {' / '.join(top.split(', ')[:4])}")


def bytes_read(dims, position: int, tied: bool = False, quant: str = "none") -> int:
    """Bytes one decode step at ``position`` must read: the weights and the cache rows up to
    the position."""
    return decoder_lm.weight_bytes_read(dims, tied, quant) + \
        decoder_lm.cache_bytes_read(dims, position + 1)


def build(road: str, dims, arch: str = "llama", last_logits: bool = False,
          quant: str = "none"):
    if road == "hf":
        return decoder_lm.transformers_lm(arch, dims, last_logits=last_logits, quant=quant)
    return decoder_lm.executorch_llama(dims, custom=road == "et", quant=quant)


def road_of(variant: str) -> str:
    return "et-plain" if variant.startswith("et-plain") else variant.split("-")[0]


def run_size(hidden: int, cache: int, args, names: list, bandwidth: float) -> None:
    dims = decoder_lm.Dims.for_hidden(hidden, cache, args.layers, args.vocab)
    tokens = args.prefill or 1
    positions = [0] if args.prefill else \
        [p for p in (int(x) for x in args.positions.split(",")) if p < cache]
    print(f"\n## hidden {dims.hidden}, {dims.layers} layers, {dims.heads} heads, "
          f"{dims.kv_heads} KV heads, vocab {dims.vocab:,}, cache {cache:,}, MLP {dims.mlp}",
          flush=True)
    programs, lms, variants = {}, {}, []
    for name in names:
        road = road_of(name)
        if road not in lms:
            lms[road] = build(road, dims, args.arch, last_logits=args.last_logits,
                              quant=args.quant)
            start = time.perf_counter()
            # --dynamic N: one program for steps of 1 to N tokens (the generation .pte's one
            # method), its decode step timed; the example has 2 tokens (1 would specialize)
            example = 2 if args.dynamic and tokens == 1 else tokens
            programs[road] = lms[road].export(tokens=example, position=0, dynamic=args.dynamic) \
                if args.dynamic else lms[road].export(tokens=tokens, position=0)
            print(f"exported {lms[road].name} in {time.perf_counter() - start:.1f} s", flush=True)
        variant = lower_variant(name, lms[road], programs[road], args.quant)
        variant.check = check_steps(variant, tokens=tokens, atol=QUANT_ATOL[args.quant])
        variant.runner = PteRunner(variant.pte)
        variants.append(variant)
        print(f"{name:18s} lowered in {variant.lower_seconds:5.1f} s, .pte "
              f"{len(variant.pte):,} B, {variant.delegate_calls} delegate calls, "
              f"{len(variant.ops_outside)} ops outside, kernels: {variant.kernels}; "
              f"{CHECK_STEPS} steps vs eager: {variant.check}", flush=True)
        for note in variant.explain[:3]:
            print(f"    {note}")
    floors = None if args.prefill else {p: bytes_read(dims, p, quant=args.quant)
                                        for p in positions}
    medians = time_positions(variants, positions, args.rounds, tokens, floors)
    base = "et-stock" if "et-stock" in names else names[0]
    step = f"prefill of {tokens} tokens" if args.prefill else "decode step"
    print(f"\n| variant | position | {step} (median of {args.rounds}) | vs {base} | "
          f"vs memory floor | on portable (ETDump) | on llama:: kernels | top ops outside "
          f"XNNPACK (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for position in positions:
        if floors:
            floor = medians[(FLOOR, position)]
            print(f"| {FLOOR}: {floors[position] / 1e6:.1f} MB moved, "
                  f"{floors[position] / floor / 1e6:.1f} GB/s | {position} | {floor:.2f} ms | | "
                  f"1.00x | | | |")
        for variant in variants:
            ms = medians[(variant.name, position)]
            share = " | | " if args.no_etdump else outside_delegates(variant, position, tokens)
            versus = "" if args.prefill else f"{ms / floor:.2f}x"
            print(f"| {variant.name} | {position} | {ms:.2f} ms | "
                  f"{ms / medians[(base, position)]:.2f}x | {versus} | {share} |", flush=True)
