"""The LLM families table (``xnnfold bench llm-families``): each family of
:mod:`xnnfold.models.families` through the public LLM API (``export_causal_lm``,
``lower_generation``, ``Generator``), one row each:

- **exports**: ``export_causal_lm`` (transformers' static cache), else its one-line reason;
- **lowers**: stock's and xnnfold's ``lower_generation``, else the reason;
- **tokens**: xnnfold's greedy tokens against eager's, teacher-forced (eager's logits of the whole
  sequence at once, no cache): how many of ``tokens`` equal eager's before the first that does
  not, and eager's top-2 margin there (a margin within rounding is a tie, not a wrong cache);
  the logits' largest deviation relative to their row's largest |logit|, xnnfold's and stock's
  (``compare_outputs(..., per_row=True)``, WRONG beyond its tolerance);
- **decode x stock**: one decode step at ``position``, xnnfold's time over stock's, medians of
  interleaved rounds, one thread;
- **portable %**: the share of xnnfold's decode step outside XNNPACK (ETDump);
- **step**: which step of the pass rewrote the decode step's attention (``kv_cache``,
  ``attention``, none).

Each family runs in a process of its own (a crash or a runaway allocation costs its row only).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from ..models import families


@dataclass(frozen=True)
class Options:
    cache: int = 1024
    prefill: int = 128
    prompt: int = 8
    tokens: int = 300
    position: int = 512
    rounds: int = 10
    etdump: bool = True


FAST = Options(cache=64, prefill=8, prompt=5, tokens=12, position=16, rounds=2, etdump=False)
COLUMNS = ("family", "class", "exports", "lowers", "tokens equal eager", "logits off (x / stock)",
           "decode ms (x / stock)", "decode x stock", "portable %", "step")


def _first_line(error: BaseException) -> str:
    from ..usage import first_line

    return first_line(error, 140)


def _decode_method(methods) -> str:
    """The method a one-token step runs: ``decode`` where the .pte has one, else ``forward``."""
    return "decode" if "decode" in methods else "forward"


def _step_taken(partitioner) -> str:
    """The step of the pass that rewrote the attention (the decode method's partitioner)."""
    result = getattr(partitioner, "last_result", None)
    if result is None:
        return ""
    rewritten = [name for name in ("kv_cache", "attention")
                 if any(r.rewritten for r in result.of(name))]
    return rewritten[0] if rewritten else "none"


def _check_tokens(model, generator, prompt: list, tokens: int) -> dict:
    """The teacher-forced check of one .pte's greedy run: matched tokens, margin at the first
    miss, the logits' verdict (``compare_outputs`` at each row's scale)."""
    from ..pte.compare import compare_outputs

    run = generator.generate(prompt, tokens, stop_at_eos=False, keep_logits=True)
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([prompt + run.tokens[:-1]]),
                      use_cache=False).logits[0, len(prompt) - 1:]
    got = torch.cat(run.logits)
    wanted = eager.argmax(-1).tolist()
    matched = next((i for i, (a, b) in enumerate(zip(run.tokens, wanted)) if a != b),
                   len(run.tokens))
    top = eager[matched].topk(2).values if matched < len(run.tokens) else None
    verdict = compare_outputs(got, eager, per_row=True)
    return {"matched": matched, "of": len(run.tokens), "relative": verdict.max_rel_diff,
            "ok": verdict.ok, "margin": None if top is None else float(top[0] - top[1])}


def _decode_ms(generators: dict, prompt_length: int, vocab: int, rounds: int) -> dict:
    """{variant: median ms of one decode step at position ``prompt_length``}, interleaved."""
    rng = random.Random(0)
    prompt = [rng.randrange(vocab) for _ in range(prompt_length)]
    for generator in generators.values():
        generator.prefill(prompt)
    times = {name: [] for name in generators}
    order = list(generators)
    for index in range(rounds + 2):                  # two warm-up rounds
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            generators[name].step(1, prompt_length)
            if index >= 2:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _portable_share(pte: bytes, method: str, position: int) -> float:
    from ..pte.devtools import DELEGATE, operator_times

    inputs = (torch.ones(1, 1, dtype=torch.long), torch.tensor([position]))
    ops = operator_times(pte, inputs, runs=5, method=method)
    total = sum(ops.values()) or 1.0
    return 100.0 * (total - ops.get(DELEGATE, 0.0)) / total


def family_row(family: str, sizes: families.Sizes, options: Options) -> dict:
    """One row of the table (see the module docstring); every failure is the row's reason."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as Stock,
    )

    from ..export.llm import CannotExport, Generator, export_causal_lm, lower_generation

    torch.set_num_threads(1)
    row = {"family": family}
    model = families.build(family, sizes)
    row["class"] = type(model).__name__
    try:
        generation = export_causal_lm(model, options.cache, options.prefill)
    except CannotExport as error:
        row["exports"] = f"no: {error.reason}"
        return row
    row["exports"] = "yes"
    lowered, failed = {}, []
    for variant, partitioner in (("stock", Stock), ("xnnfold", None)):
        try:
            lowered[variant] = lower_generation(generation, partitioner)
        except Exception as error:  # noqa: BLE001 - the row says why
            failed.append(f"{variant}: {_first_line(error)}")
    row["lowers"] = "; ".join(failed) if failed else "yes"
    if "xnnfold" not in lowered:
        return row
    generators = {variant: Generator(low.pte) for variant, low in lowered.items()}
    method = _decode_method(lowered["xnnfold"].partitioners)
    row["step"] = _step_taken(lowered["xnnfold"].partitioners.get(method))
    rng = random.Random(1)
    prompt = [rng.randrange(sizes.vocab) for _ in range(options.prompt)]
    checks = {variant: _check_tokens(model, g, prompt, options.tokens)
              for variant, g in generators.items()}
    row["checks"] = checks
    timed = _decode_ms(generators, options.position, sizes.vocab, options.rounds)
    row["decode_ms"] = timed
    if options.etdump:
        row["portable"] = _portable_share(lowered["xnnfold"].pte, method, options.position)
    return row


def _tokens_cell(check: dict) -> str:
    text = f"{check['matched']}/{check['of']}"
    if check["margin"] is not None:
        text += f" (eager's top-2 margin there {check['margin']:.1e})"
    return text


def _off(check: dict) -> str:
    return f"{check['relative']:.1e}" + ("" if check["ok"] else " WRONG")


def cells(row: dict) -> list:
    """The row's cells, in :data:`COLUMNS` order."""
    checks, timed = row.get("checks", {}), row.get("decode_ms", {})
    mine, stock = checks.get("xnnfold"), checks.get("stock")
    off = "" if mine is None else _off(mine) + ("" if stock is None else f" / {_off(stock)}")
    ms = "" if "xnnfold" not in timed else f"{timed['xnnfold']:.2f}" + \
        ("" if "stock" not in timed else f" / {timed['stock']:.2f}")
    ratio = f"{timed['xnnfold'] / timed['stock']:.2f}x" if {"xnnfold", "stock"} <= set(timed) \
        else ""
    portable = f"{row['portable']:.1f}" if "portable" in row else ""
    return [row.get("family", ""), row.get("class", ""), row.get("exports", ""),
            row.get("lowers", ""), "" if mine is None else _tokens_cell(mine), off, ms, ratio,
            portable, row.get("step", "")]


def markdown(rows: list, heading: str) -> str:
    lines = [heading, "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _child(send, family: str, sizes, options) -> None:
    send(family_row(family, sizes, options))


def isolated_row(family: str, sizes: families.Sizes, options: Options) -> dict:
    """:func:`family_row` in a process of its own; a process that dies is the row's reason."""
    from ..pte.child import Child, ChildDied

    try:
        with Child(_child, family, sizes, options) as child:
            return child.receive()
    except ChildDied as died:
        return {"family": family, "exports": f"crashed: {died}"}
    except Exception as error:  # noqa: BLE001 - one family's failure is its row
        return {"family": family, "exports": f"failed: {_first_line(error)}"}
