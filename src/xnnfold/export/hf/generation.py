"""``xnnfold hf`` on a causal LM: the generation-ready .pte (:mod:`xnnfold.export.llm`), checked
against eager and, with ``--compare``, beside stock's lowering of the same two programs.

The check: a prompt of ``--tokens`` tokens through ``prefill``, then
:data:`~xnnfold.export.hf.plan.CHECK_STEPS` greedy ``decode`` steps on the runtime; each step's
logits against eager transformers' logits of the whole sequence at once (no cache), so the
cache's update, its mask and its sharing between the two methods are all checked. The timing:
interleaved rounds, each a prefill of the prompt and the same decode steps, medians.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..adaptations import adaptations
from . import plan as hf_plan, rows as hf_rows


@dataclass
class MethodLowering:
    """One method of a lowered generation .pte, as a table row reads it."""

    pte_bytes: int
    lower_seconds: float
    gemms_outside: list
    delegate_calls: int
    ops_outside: list


# xnnfold with llm_kernels=True (``--llm-kernels``): the cache on executorch's LLM kernels
XNNFOLD_LLM = "xnnfold-llm"


def _lower(generation, variant: str, prefer: str) -> tuple:
    """(.pte bytes, {method: MethodLowering}) of one variant (stock, xnnfold, xnnfold-llm)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from ...analysis.gemms import EDGE_GEMM_NAMES
    from ..llm import lower_generation
    from ...pte import STOCK, inspect_lowered

    def outside(edge) -> dict:
        return {method: inspect_lowered(edge.exported_program(method))[:2]
                for method in generation.programs}

    start = time.perf_counter()
    if variant == STOCK:
        lowered = lower_generation(generation, StockXnnpackPartitioner, before_emit=outside)
    else:
        lowered = lower_generation(generation, partitioner_kwargs={
            "prefer": prefer, "llm_kernels": variant == XNNFOLD_LLM}, before_emit=outside)
    seconds = time.perf_counter() - start
    methods = {method: MethodLowering(len(lowered.pte), seconds,
                                      [op for op in ops if op in EDGE_GEMM_NAMES], calls, ops)
               for method, (ops, calls) in lowered.inspected.items()}
    return lowered.pte, methods


def _check(model, generator, prompt: list) -> tuple:
    """(prefill's verdict, decode's verdict): the runtime's logits of a greedy run against
    eager's over the whole sequence, each judged against its row's scale (``per_row``)."""
    from ...pte.compare import compare_outputs

    run = generator.generate(prompt, hf_plan.CHECK_STEPS + 1, stop_at_eos=False, keep_logits=True)
    sequence = prompt + run.tokens[:-1]
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
    expected = eager[len(prompt) - 1:]                      # the rows that predict each token
    got = torch.cat(run.logits)
    return (compare_outputs(got[:1], expected[:1], per_row=True),
            compare_outputs(got[1:], expected[1:], per_row=True))


def _time(generators: dict, prompt: list, steps: int, rounds: int, seed: int = 0) -> dict:
    """{variant: (prefill ms medians, decode ms per step medians)}, interleaved rounds."""
    times = {variant: ([], []) for variant in generators}
    order, rng = list(generators), random.Random(seed)
    for index in range(rounds + 2):                         # two warm-up rounds
        rng.shuffle(order)
        for variant in order:
            generator = generators[variant]
            start = time.perf_counter()
            logits = generator.prefill(prompt)
            prefill = time.perf_counter() - start
            token, start = int(logits.argmax()), time.perf_counter()
            for position in range(len(prompt), len(prompt) + steps):
                token = int(generator.step(token, position).argmax())
            decode = (time.perf_counter() - start) / steps
            if index >= 2:
                times[variant][0].append(prefill * 1e3)
                times[variant][1].append(decode * 1e3)
    return {v: (statistics.median(p), statistics.median(d)) for v, (p, d) in times.items()}


def _stock_verdicts(model, generation, prompt: list, verdicts: dict, written: str,
                    prefer: str) -> tuple:
    """Stock's verdicts on the same check, for a failing check to show beside xnnfold's: the
    ones already computed (``--compare``), else stock lowered and checked now (only when the
    written .pte failed: is eager's deviation xnnfold's or executorch's?)."""
    from ..llm import Generator
    from ...pte import STOCK

    mine = verdicts[written]
    if all(v is None or v.ok for v in mine):
        return (None, None)
    if STOCK in verdicts:
        return verdicts[STOCK]
    try:
        pte, _ = _lower(generation, STOCK, prefer)
    except Exception as error:  # noqa: BLE001 - said beside the failure, not raised
        return (f"not lowered ({type(error).__name__})",) * 2
    return _check(model, Generator(pte), prompt)


def export_generation(model, output: Path, compare: bool, tokens: int, reps: int, prefer: str,
                      check: bool, max_cache: Optional[int], max_prefill: Optional[int],
                      llm_kernels: bool = False) -> "hf_rows.Exported":
    """The generation .pte of ``model`` written to ``output`` (``llm_kernels``: the cache's
    update and attention on executorch's LLM kernels), checked; with ``compare``, stock and
    (with ``llm_kernels``) xnnfold's default beside it, timed interleaved."""
    from ..llm import Generator, export_causal_lm
    from ...pte import STOCK, XNNFOLD

    name = type(model).__name__
    with hf_rows.failing_as_usage(f"{name}: the export with transformers' static cache (--no-cache "
                             "exports its logits without a cache)"):
        generation = export_causal_lm(model, max_cache, max_prefill)
    written = XNNFOLD_LLM if llm_kernels else XNNFOLD
    variants = [STOCK, XNNFOLD] if compare else []
    if written not in variants:
        variants.append(written)
    with hf_rows.failing_as_usage(f"lowering {name}'s prefill and decode"):
        lowered = {variant: _lower(generation, variant, prefer) for variant in variants}
    output.write_bytes(lowered[written][0])
    generators = {variant: Generator(pte) for variant, (pte, _) in lowered.items()}
    torch.manual_seed(0)
    prompt = torch.randint(0, generation.metadata["get_vocab_size"], (tokens,)).tolist()
    verdicts = {variant: _check(model, g, prompt) if check else (None, None)
                for variant, g in generators.items()}
    timed = _time(generators, prompt, hf_plan.CHECK_STEPS, reps) if compare else {}
    stock = _stock_verdicts(model, generation, prompt, verdicts, written, prefer)
    exported = hf_rows.Exported([], [], [])
    for variant, (_, methods) in lowered.items():
        for index, method in enumerate(("prefill", "decode")):
            verdict = verdicts[variant][index]
            if verdict is not None and not verdict.ok and variant == written:
                exported.wrong.append(f"{output} ({method}): {verdict}; stock's .pte of the "
                                      f"same programs: {stock[index]}")
            exported.rows.append(hf_rows.row(
                method, variant, methods[method], verdict,
                timed[variant][index] if timed else None,
                str(output) if variant == written else ""))
    exported.notes += [a.describe(name) for a in adaptations(model)]
    exported.notes.append(
        f"{output}: methods prefill (1 to {generation.max_prefill} tokens) and decode (1 "
        f"token) over a static KV cache of {generation.max_cache} rows; run it with "
        f"`xnnfold generate {output} --tokens 1,2,3 --max-new 32`")
    exported.notes.extend(hf_plan.as_options(line) for line in generation.capped)
    for variant, (prefill_ms, decode_ms) in timed.items():
        exported.notes.append(
            f"{variant}: prefill of {tokens} tokens {prefill_ms:.3f} ms "
            f"({tokens / prefill_ms * 1e3:,.1f} tokens/s); decode {decode_ms:.3f} ms per "
            f"token ({1e3 / decode_ms:,.1f} tokens/s); medians of {reps} interleaved rounds")
    return exported
