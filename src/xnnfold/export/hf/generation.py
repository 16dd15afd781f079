"""``xnnfold hf`` on a causal LM: the generation-ready .pte (:mod:`xnnfold.export.llm`, one
``forward`` method, the layout executorch's ``TextLLMRunner`` runs), its linears quantized with
``--quantize``, checked against eager and, with ``--compare``, beside stock's lowering of the
same program; the folder's tokenizer copied beside it and the runner's command lines printed.

The check: a prompt of ``--tokens`` tokens (the prefill phase), then
:data:`~xnnfold.export.hf.plan.CHECK_STEPS` one-token calls (the decode phase) on the runtime,
fed eager's greedy tokens; each call's logits against eager transformers' logits of the whole
sequence at once (no cache; a quantized .pte against the quantized eager model, within its
own spread: :func:`~xnnfold.pte.compare.compare_to_spread`), so the cache's update and its mask are
checked. Eager's side is computed before the lowering, and the written .pte is checked from its
file once the exported program and the .pte's bytes are dropped: the check adds the runtime's
load alone to the export's memory. The timing: interleaved rounds, each a prefill of the
prompt and the same decode steps, medians.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..adaptations import adaptations
from . import plan as hf_plan, rows as hf_rows
from .generation_check import EagerReference, check as _check, eager_reference
from ...pte.timing import medians_interleaved


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


def _lower(generation, variant: str, prefer: str, output: Optional[Path] = None) -> tuple:
    """(.pte bytes, MethodLowering) of one variant (stock, xnnfold, xnnfold-llm); with
    ``output``, (``output``, MethodLowering): the .pte streamed into that file."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from ...analysis.gemms import EDGE_GEMM_NAMES
    from ..llm import lower_generation
    from ...pte import STOCK, inspect_lowered

    def outside(edge) -> tuple:
        (method,) = generation.programs
        return inspect_lowered(edge.exported_program(method))[:2]

    start = time.perf_counter()
    if variant == STOCK:
        lowered = lower_generation(generation, StockXnnpackPartitioner, before_emit=outside,
                                   output=output)
    else:
        lowered = lower_generation(generation, partitioner_kwargs={
            "prefer": prefer, "llm_kernels": variant == XNNFOLD_LLM}, before_emit=outside,
            output=output)
    seconds = time.perf_counter() - start
    ops, calls = lowered.inspected
    size = len(lowered.pte) if output is None else output.stat().st_size
    return (lowered.pte if output is None else output), MethodLowering(
        size, seconds, [op for op in ops if op in EDGE_GEMM_NAMES], calls, ops)


def _time(generators: dict, prompt: list, steps: int, rounds: int, seed: int = 0) -> dict:
    """{variant: (prefill ms medians, decode ms per step medians)}, interleaved rounds (two
    warm-up)."""
    def measure(generator) -> tuple:
        start = time.perf_counter()
        logits = generator.prefill(prompt)
        prefill = time.perf_counter() - start
        token, start = int(logits.argmax()), time.perf_counter()
        for position in range(len(prompt), len(prompt) + steps):
            token = int(generator.step(token, position).argmax())
        return prefill * 1e3, (time.perf_counter() - start) * 1e3 / steps

    return medians_interleaved(generators, measure, rounds, warmup=2, seed=seed)


def _experts_left_fp32(model) -> str:
    """What ``--quantize`` leaves in fp32 in a mixture of experts: the experts' stacked weights
    are no ``nn.Linear`` (the quantization takes linears only); said, not hidden."""
    from ..experts import experts_modules

    modules = experts_modules(model)
    if not modules:
        return ""
    stacked = sum(p.numel() for m in modules for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in model.parameters())
    return (f" (the experts' stacked weights, {stacked / max(total, 1):.0%} of the parameters, "
            "stay fp32)")


def _stock_verdicts(export, reference: EagerReference, verdicts: dict, written: str,
                    prefer: str, quantized: bool = False) -> tuple:
    """Stock's verdicts on the same check, for a failing check to show beside xnnfold's: the
    ones already computed (``--compare``), else stock lowered (the program exported again by
    ``export()``) and checked now (only when the written .pte failed: is eager's deviation
    xnnfold's or executorch's?)."""
    from ..llm import Generator
    from ...pte import STOCK

    mine = verdicts[written]
    if all(v is None or v.ok for v in mine):
        return (None, None)
    if STOCK in verdicts:
        return verdicts[STOCK]
    try:
        pte, _ = _lower(export(), STOCK, prefer)
    except Exception as error:  # noqa: BLE001 - said beside the failure, not raised
        return (f"not lowered ({type(error).__name__})",) * 2
    return _check(reference, Generator(pte), quantized)


def export_generation(model, output: Path, compare: bool, tokens: int, reps: int, prefer: str,
                      check: bool, max_cache: Optional[int], max_prefill: Optional[int],
                      llm_kernels: bool = False, quantize: Optional[str] = None,
                      folder: Optional[str] = None) -> "hf_rows.Exported":
    """The generation .pte of ``model`` written to ``output`` (``llm_kernels``: the cache's
    update and attention on executorch's LLM kernels; ``quantize``: a scheme of
    :mod:`xnnfold.export.llm.quantize`), checked; with ``compare``, stock and (with
    ``llm_kernels``) xnnfold's default beside it, timed interleaved. ``folder``'s tokenizer
    files are copied beside ``output``."""
    from ..llm import Generator, export_causal_lm
    from ..llm.export import quantized_copy
    from ..llm.quantize import is_quantized
    from ...pte import STOCK, XNNFOLD

    name = type(model).__name__
    if quantize is not None and not is_quantized(model):
        with hf_rows.failing_as_usage(f"{name}: `quantize` {quantize}"):
            model = quantized_copy(model, quantize)     # also the eager reference of the check

    def export():
        with hf_rows.failing_as_usage(f"{name}: the export with transformers' static cache "
                                      "(`cache=False` exports its logits without a cache)"):
            return export_causal_lm(model, max_cache, max_prefill)

    generation = export()
    written = XNNFOLD_LLM if llm_kernels else XNNFOLD
    variants = [STOCK, XNNFOLD] if compare else []
    if written not in variants:
        variants.append(written)
    torch.manual_seed(0)
    vocab = generation.metadata["get_vocab_size"]
    prompt = torch.randint(0, vocab, (tokens,)).tolist()
    reference = eager_reference(model, prompt) if check else None
    # the written variant last, streamed into its file (whole, or the name left as it was):
    # its bytes are never in memory, and the name is untouched if another variant fails
    with hf_rows.failing_as_usage(f"lowering {name}'s forward"):
        lowered = {variant: _lower(generation, variant, prefer,
                                   output if variant == written else None)
                   for variant in variants}
    sized = (generation.max_prefill, generation.max_cache, generation.capped)
    # what the check needs is the file and eager's reference: the program dropped before the
    # runtime loads the .pte (its memory would add to the load's)
    del generation
    gc.collect()
    generators = {variant: Generator(pte) for variant, (pte, _) in lowered.items()}
    verdicts = {variant: _check(reference, g, quantize is not None) if check
                else (None, None) for variant, g in generators.items()}
    timed = _time(generators, prompt, hf_plan.CHECK_STEPS, reps) if compare else {}
    del generators
    stock = _stock_verdicts(export, reference, verdicts, written, prefer, quantize is not None)
    max_prefill, max_cache, capped = sized
    exported = hf_rows.Exported([], [], [])
    for variant, (_, method) in lowered.items():
        for index, phase in enumerate(("prefill", "decode")):
            verdict = verdicts[variant][index]
            if verdict is not None and not verdict.ok and variant == written:
                exported.wrong.append(f"{output} ({phase}): {verdict}; stock's .pte of the "
                                      f"same programs: {stock[index]}")
            exported.rows.append(hf_rows.row(
                phase, variant, method, verdict, timed[variant][index] if timed else None,
                str(output) if variant == written else ""))
    exported.notes += [a.describe(name) for a in adaptations(model)]
    quantized = "" if quantize is None else f", linears quantized {quantize}" + \
        _experts_left_fp32(model)
    exported.notes.append(
        f"{output}: one method, forward (1 to {max_prefill} tokens a call: the "
        f"prefill and decode rows above are its two phases), over a static KV cache of "
        f"{max_cache} rows{quantized}")
    exported.notes.extend(hf_plan.as_options(line) for line in capped)
    exported.notes += runner_notes(output, folder, llm_kernels, vocab)
    for variant, (prefill_ms, decode_ms) in timed.items():
        exported.notes.append(
            f"{variant}: prefill of {tokens} tokens {prefill_ms:.3f} ms "
            f"({tokens / prefill_ms * 1e3:,.1f} tokens/s); decode {decode_ms:.3f} ms per "
            f"token ({1e3 / decode_ms:,.1f} tokens/s); medians of {reps} interleaved rounds")
    return exported


def runner_notes(output: Path, folder: Optional[str], llm_kernels: bool, vocab: int) -> list:
    """The folder's tokenizer copied beside ``output``, and how to run the .pte with it:
    ``xnnfold generate``, executorch's ``TextLLMRunner`` in Python (in the wheel), its
    ``llama_main`` (a C++ program built from executorch's sources); a
    warning when the runner would sample among more ids than the model has logits (it takes
    its sampler's size from the tokenizer)."""
    from ..llm.text import RunnerTokenizer, copy_tokenizer

    tokenizer = None if folder is None else copy_tokenizer(folder, output.parent)
    if tokenizer is None:
        return [f"no tokenizer in {folder} (tokenizer.json, tokenizer.model): executorch's "
                "runner needs one; give token ids: `xnnfold generate "
                f"{output} --tokens 1,2,3 --max-new 32`"]
    # --llm-kernels: the runner finds the llama:: kernels once their library is imported
    custom = "from executorch.extension.llm.custom_ops import custom_ops; " if llm_kernels \
        else ""
    notes = []
    try:
        ids = RunnerTokenizer(tokenizer).vocab_size
    except ValueError as error:
        notes.append(f"warning: {error}")
    else:
        if ids > vocab:
            notes.append(f"warning: {tokenizer.name} has {ids:,} ids, the model {vocab:,} "
                         "logits: executorch's runner samples among the tokenizer's ids and "
                         "would read past the logits")
    return notes + [f"its tokenizer: {tokenizer} (copied from {folder})",
            f"run it: xnnfold generate {output} --prompt 'Hello' --max-new 32",
            f"executorch's runner (Python): {custom}from executorch.extension.llm.runner "
            f"import GenerationConfig, TextLLMRunner; TextLLMRunner({str(output)!r}, "
            f"{str(tokenizer)!r}).generate('Hello', GenerationConfig(max_new_tokens=32, "
            "temperature=0))",
            "executorch's runner (C++): not in the pip wheel, a program built from "
            "executorch's sources (examples/models/llama"
            f"{', with its LLM custom ops' if llm_kernels else ''}), then: llama_main "
            f"--model_path {output} --tokenizer_path {tokenizer} --prompt 'Hello' --temperature 0 "
            "--max_new_tokens 32"]
