"""``xnnfold hf`` on an encoder-decoder model whose decoder has Whisper's / BART's
cross-attention: the generation-ready .pte of :mod:`xnnfold.export.seq2seq` (``encoder``,
``text_decoder``) and its .ptd, checked against eager and, with ``--compare``, beside stock's
lowering of the same two programs.

The check: the encoder on a seeded input (Whisper: random log-mel features of its window;
text: ``--tokens`` random ids), then :data:`~xnnfold.export.hf.plan.CHECK_STEPS` + 1 greedy
decoder steps from the start token on the runtime; each step's logits against eager
transformers' logits of the whole decoder sequence at once (no cache), so the cross keys and
values, the self-attention cache and its mask are all checked. The timing: the encoder and the
decoder steps in interleaved rounds, medians.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import torch

from . import plan as hf_plan, rows as hf_rows
from ...pte.compare import compare_outputs
from ...pte.files import write_all_atomically, write_atomically
from ...pte.timing import medians_interleaved
from .generation import MethodLowering


def _lower(programs, variant: str, prefer: str) -> tuple:
    """(LoweredSeq2Seq, {method: MethodLowering}) of stock or xnnfold."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from ...analysis.gemms import EDGE_GEMM_NAMES
    from ...pte import STOCK, inspect_lowered
    from ..seq2seq import lower_seq2seq

    def outside(edge) -> dict:
        return {method: inspect_lowered(edge.exported_program(method))[:2]
                for method in programs.programs}

    if variant == STOCK:      # stock as users run it: the table stored twice, no .ptd
        lowered = lower_seq2seq(programs, StockXnnpackPartitioner, table_to_ptd=False,
                                before_emit=outside)
    else:
        lowered = lower_seq2seq(programs, partitioner_kwargs={"prefer": prefer},
                                before_emit=outside)
    size = len(lowered.pte) + len(lowered.ptd or b"")
    return lowered, {method: MethodLowering(size, lowered.seconds,
                                            [op for op in ops if op in EDGE_GEMM_NAMES],
                                            calls, ops)
                     for method, (ops, calls) in lowered.inspected.items()}


def example_input(model, tokens: int) -> torch.Tensor:
    """Seeded: Whisper's window of log-mel features, or ``tokens`` source ids."""
    generator = torch.Generator().manual_seed(0)
    config = model.config
    if getattr(config, "num_mel_bins", None) is not None:
        return torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions,
                           generator=generator)
    return torch.randint(0, config.vocab_size, (1, tokens), generator=generator)


def _check(model, program, inputs: torch.Tensor):
    """The runtime's logits of greedy steps from the start token against eager's."""
    encoded = program.encode(inputs)
    sequence, got = [program.start], []
    for position in range(hf_plan.CHECK_STEPS + 1):
        logits = program.step(sequence[-1], encoded, position)
        got.append(logits)
        sequence.append(int(logits.argmax()))
    name = "input_features" if inputs.is_floating_point() else "input_ids"
    with torch.no_grad():
        expected = model(**{name: inputs}, decoder_input_ids=torch.tensor([sequence[:-1]]),
                         use_cache=False).logits[0]
    return compare_outputs(torch.stack(got), expected, per_row=True)


def _time(programs: dict, inputs: torch.Tensor, rounds: int, seed: int = 0) -> dict:
    """{variant: (encoder ms, decoder ms per step)}: medians of interleaved rounds (one
    warm-up), each the encoder then CHECK_STEPS decoder steps."""
    def measure(program) -> tuple:
        start = time.perf_counter()
        encoded = program.encode(inputs)
        encoder = time.perf_counter() - start
        token, start = program.start, time.perf_counter()
        for position in range(hf_plan.CHECK_STEPS):
            token = int(program.step(token, encoded, position).argmax())
        return encoder * 1e3, (time.perf_counter() - start) * 1e3 / hf_plan.CHECK_STEPS

    return medians_interleaved(programs, measure, rounds, warmup=1, seed=seed)


def export_seq2seq_generation(model, output: Path, folder: str, compare: bool, tokens: int,
                              reps: int, prefer: str, check: bool,
                              max_cache: Optional[int]) -> "hf_rows.Exported":
    """The generation .pte of ``model`` written to ``output`` (its .ptd beside it), checked;
    with ``compare``, stock's lowering beside it, timed interleaved."""
    from ...pte import STOCK, XNNFOLD
    from ..seq2seq import DECODER, ENCODER, Seq2SeqProgram, export_seq2seq

    name = type(model).__name__
    with hf_rows.failing_as_usage(f"{name}: the export of its encoder and cached decoder "
                                  "(`cache=False` exports the encoder and one decoder "
                                  "step)"):
        programs = export_seq2seq(model, max_cache)
    variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
    with hf_rows.failing_as_usage(f"lowering {name}'s encoder and text_decoder"):
        lowered = {variant: _lower(programs, variant, prefer) for variant in variants}
    ptd = output.with_suffix(".ptd")
    written, _ = lowered[XNNFOLD]
    # both complete before either name is taken: never a new .pte beside a half-written .ptd
    write_all_atomically({output: written.pte, **(
        {ptd: written.ptd} if written.ptd is not None else {})})
    if written.ptd is None and ptd.exists():
        ptd.unlink()                       # a stale .ptd would be loaded beside this .pte
    loaded = {XNNFOLD: Seq2SeqProgram(output)}
    if compare:
        stock = output.with_suffix(".stock.pte")
        write_atomically(stock, lowered[STOCK][0].pte)
        try:
            loaded[STOCK] = Seq2SeqProgram(stock, data=None)
        finally:
            stock.unlink()                 # loaded: the runtime keeps its own copy
    inputs = example_input(model, tokens)
    verdicts = {v: _check(model, p, inputs) if check else None for v, p in loaded.items()}
    timed = _time(loaded, inputs, reps) if compare else {}
    exported = hf_rows.Exported([], [], [])
    for variant, (lowering, methods) in lowered.items():
        verdict = verdicts[variant]
        if verdict is not None and not verdict.ok and variant == XNNFOLD:
            exported.wrong.append(f"{output}: {verdict}")
        for index, method in enumerate((ENCODER, DECODER)):
            exported.rows.append(hf_rows.row(
                method, variant, methods[method], verdict,
                timed[variant][index] if timed else None,
                str(output) if variant == XNNFOLD else ""))
            exported.rows[-1]["ptd_bytes"] = len(lowering.ptd or b"")    # in pte_bytes
    tokenizer = None
    if not programs.speech:         # text: `xnnfold generate --prompt` reads it beside the .pte
        from ..llm.text import copy_tokenizer

        tokenizer = copy_tokenizer(folder, output.parent)
    exported.notes.append(_usage_note(output, written.ptd is not None, folder, programs,
                                      tokenizer is not None))
    if tokenizer is not None:
        exported.notes.append(f"its tokenizer: {tokenizer} (copied from {folder})")
    return exported


def _usage_note(output: Path, with_ptd: bool, folder: str, programs, tokenizer: bool) -> str:
    ptd = output.with_suffix(".ptd")
    data = f" and {ptd} (the tied output head's table, which the token lookup and the head " \
           "both read: pass it with the .pte)" if with_ptd else ""
    runner = f"whisper_runner --model_path {output}" + (f" --data_path {ptd}" if with_ptd else "")
    run = f"xnnfold transcribe {output} FEATURES.npy|AUDIO.wav --folder {folder}" \
        if programs.speech else f"xnnfold generate {output} " + (
            "--prompt 'Hello'" if tokenizer else "--tokens 1,2,3")
    return (f"{output}{data}: methods encoder (once per input; it returns every decoder "
            f"layer's cross-attention keys and values) and text_decoder (one token per call "
            f"over a self-attention cache of {programs.max_cache} rows), the layout "
            f"executorch's speech runner calls ({runner}: a C++ program not in the pip wheel, "
            f"built from executorch's sources, examples/models/whisper); run it with `{run}`")
