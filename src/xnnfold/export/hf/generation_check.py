"""The check of a generation .pte (:mod:`xnnfold.export.hf.generation`): eager's side computed
before the lowering (:func:`eager_reference`), so that the exported program, the eager
model's activations and the .pte's bytes need not be alive when the runtime loads the .pte
(:func:`check`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import plan as hf_plan


@dataclass
class EagerReference:
    """What the check compares a .pte with, computed before the lowering: the prompt, the
    sequence eager's greedy tokens extend it to, and eager's logits of the rows that predict
    each new token (no cache, the whole sequence at once)."""

    prompt: list
    sequence: list
    logits: torch.Tensor               # (CHECK_STEPS + 1, V)
    # a quantized model's: the same rows again, its quantized linears' inputs nudged
    spread: Optional[torch.Tensor] = None


def eager_reference(model, prompt: list) -> EagerReference:
    """``model``'s greedy continuation of ``prompt`` by :data:`~.plan.CHECK_STEPS` tokens, each
    recomputed over the whole sequence, and its logits of the rows the check compares; for a
    quantized model, also those rows' spread (:func:`nudged_logits`)."""
    from ..llm.quantize import is_quantized

    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(hf_plan.CHECK_STEPS):
            logits = model(input_ids=torch.tensor([sequence]), use_cache=False).logits
            sequence.append(int(logits[0, -1].argmax()))
        eager = model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
    rows = slice(len(prompt) - 1, None)
    spread = nudged_logits(model, sequence)[rows].clone() if is_quantized(model) else None
    return EagerReference(list(prompt), sequence, eager[rows].clone(), spread)


def nudged_logits(model, sequence: list, seed: int = 0) -> torch.Tensor:
    """``model``'s logits of ``sequence`` (no cache) with every input of its quantized linears
    moved by a relative :data:`~xnnfold.pte.compare.SPREAD_NUDGE` (seeded, normal): eager's own
    sensitivity to its kernels' rounding, what a quantized .pte is judged against. The hooks
    are removed before this returns: ``model`` is left as it was."""
    from ...pte.compare import SPREAD_NUDGE
    from ..llm.quantize import quantized_linears

    generator = torch.Generator().manual_seed(seed)

    def nudged(module, args):
        x = args[0]
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
        return (x * (1 + SPREAD_NUDGE * noise),) + tuple(args[1:])

    hooks = [m.register_forward_pre_hook(nudged) for m in quantized_linears(model)]
    try:
        with torch.no_grad():
            return model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
    finally:
        for hook in hooks:
            hook.remove()


def check(reference: EagerReference, generator, quantized: bool = False) -> tuple:
    """(prefill's verdict, decode's verdict): the runtime's logits of the prompt, then of each
    of eager's tokens fed one a call, against eager's over the whole sequence, each judged
    against its row's scale (``per_row``); a quantized .pte against eager's own spread
    (:func:`~xnnfold.pte.compare.compare_to_spread`), or within the quantized tolerance when
    ``reference`` has none."""
    prompt, sequence = reference.prompt, reference.sequence
    got = [generator.prefill(prompt)]
    got += [generator.step(sequence[position], position)
            for position in range(len(prompt), len(sequence))]
    got, expected = torch.cat(got), reference.logits
    if quantized and reference.spread is not None:
        from ...pte.compare import compare_to_spread

        spread = reference.spread
        return (compare_to_spread(got[:1], expected[:1], spread[:1]),
                compare_to_spread(got[1:], expected[1:], spread[1:]))
    judge = _quantized_judge if quantized else _per_row_judge
    return judge(got[:1], expected[:1]), judge(got[1:], expected[1:])


def _per_row_judge(actual, expected):
    from ...pte.compare import compare_outputs

    return compare_outputs(actual, expected, per_row=True)


def _quantized_judge(actual, expected):
    """A quantized .pte against its quantized eager model (:func:`quantized_tolerance`)."""
    from ...pte.compare import compare_outputs, quantized_tolerance

    return compare_outputs(actual, expected, **quantized_tolerance(expected))
