"""LLM generation timed in executorch's runner (``xnnfold bench llm-runner``): the
variants of :mod:`xnnfold.bench.scripts.llm_runner` exported, checked against each other and
timed interleaved.

``TextLLMRunner`` reports its times in whole milliseconds (``Stats``): a round generates enough
tokens (``--new``) for the decode per token to be read to a few hundredths of a millisecond;
the prefill of ``--prompt`` tokens is read to the millisecond.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from .decode import machine_line, one_thread
from .runner_variants import (NOTES, InGenerator, InRunner, TwoMethods, export_variants,
                              prompt_text, write_tokenizer)


def step_calls(ptes: dict, position: int, calls: int) -> dict:
    """{.pte variant: ms of each one-token call at ``position``, by round}: each .pte's one-token
    method (``forward``; the two-method layout's static ``decode``) called in turn, the order
    rotated every round, ``calls`` rounds: the decode step itself, without the runner's
    sampling and printing, to a few microseconds (the rounds of whole generations are
    noisier)."""
    from executorch.runtime import Runtime

    from ..pte.runner import load_llm_kernels

    methods, buffers = {}, {}
    for name, path in ptes.items():
        if name.startswith("generate"):
            continue
        buffers[name] = path.read_bytes()
        load_llm_kernels(buffers[name])
        program = Runtime.get().load_program(buffers[name])
        methods[name] = program.load_method("decode" if name.startswith("two-method")
                                            else "forward")
    inputs = (torch.tensor([[1]]), torch.tensor([position]))
    times = {name: [] for name in methods}
    order = list(methods)
    for index in range(calls + 3):
        order = order[1:] + order[:1]
        for name in order:
            start = time.perf_counter()
            methods[name].execute(inputs)
            if index >= 3:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def _paired(times: dict, name: str, other: str) -> float:
    """The median over rounds of ``name``'s call over ``other``'s in the same round (the
    machine's load drifts less within a round than over a run)."""
    return statistics.median(a / b for a, b in zip(times[name], times[other]))


def run(args) -> None:
    from ..export.llm.text import RunnerTokenizer

    one_thread()
    print(f"machine: {machine_line()}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        write_tokenizer(folder / "tokenizer.json", args.vocab)
        tokenizer = RunnerTokenizer(folder / "tokenizer.json")
        text = prompt_text(args.prompt)
        ids = tokenizer.encode(text)
        ptes = export_variants(args, folder)
        kinds = {"runner": InRunner, "optimum": InRunner, "generate": InGenerator,
                 "two-method": TwoMethods}
        variants = {name: kinds[name.replace("-llm", "")](
            pte, folder / "tokenizer.json" if kinds[name.replace("-llm", "")] is InRunner
            else tokenizer) for name in args.variant_list if (pte := ptes.get(name))}
        times = {name: ([], []) for name in variants}
        texts, order, rng = {}, list(variants), random.Random(0)
        print(f"prompt: {len(ids)} tokens, {args.new} generated per round, {args.rounds} "
              f"rounds after one untimed; {machine_line()}", flush=True)
        for index in range(args.rounds + 1):
            rng.shuffle(order)
            for name in order:
                prefill, decode, texts[name] = variants[name].run(text, ids, args.new)
                if index:
                    times[name][0].append(prefill)
                    times[name][1].append(decode)
        print(f"after: {machine_line()}")
        _table(args, times, texts)
        steps = step_calls(ptes, len(ids), 50 * args.rounds)
        print(f"\none-token calls at position {len(ids)}, {50 * args.rounds} rounds: medians, and "
              "of each round's ratio "
              f"({machine_line()}):")
        for name, calls in steps.items():
            base = name.replace("runner", "two-method")
            versus = [f"{_paired(steps, name, b):.3f}x {b}" for b in (base, "optimum")
                      if b != name and b in steps]
            print(f"- {name}: {statistics.median(calls):.3f} ms" +
                  (f" (paired: {', '.join(versus)})" if versus else ""))


def _table(args, times: dict, texts: dict) -> None:
    medians = {n: (statistics.median(p), statistics.median(d)) for n, (p, d) in times.items()}
    base = {n: n.replace("runner", "two-method").replace("generate", "two-method")
            for n in medians}
    reference = next(iter(medians))
    print(f"\n| variant | prefill of {args.prompt} tokens (ms) | decode (ms per token) | "
          f"vs two-method (same kernels), prefill / decode | vs optimum | text vs {reference} |")
    print("|---|---|---|---|---|---|")
    first = texts[reference]
    for name, (prefill, decode) in medians.items():
        two = medians.get(base[name]) if base[name] != name else None
        opt = medians.get("optimum") if name != "optimum" else None
        ratio = (lambda m: "" if m is None or not min(m) else
                 f"{prefill / m[0]:.2f}x / {decode / m[1]:.2f}x")
        same = "same" if texts[name] == first else \
            f"differ after {len(_common(texts[name], first))} characters"
        print(f"| {name} | {prefill:.1f} | {decode:.2f} | {ratio(two)} | {ratio(opt)} | "
              f"{same} |")
    print("\n" + "\n".join(f"- {n}: {NOTES[n]}" for n in medians))


def _common(a: str, b: str) -> str:
    return a[:next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))]

