"""The check of a generation .pte (:mod:`xnnfold.export.hf.generation`): eager's side computed
before the lowering (:func:`eager_reference`), so that the exported program, the eager
model's activations and the .pte's bytes need not be alive when the runtime loads the .pte
(:func:`check`)."""

from __future__ import annotations

from dataclasses import dataclass

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


def eager_reference(model, prompt: list) -> EagerReference:
    """``model``'s greedy continuation of ``prompt`` by :data:`~.plan.CHECK_STEPS` tokens, each
    recomputed over the whole sequence, and its logits of the rows the check compares."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(hf_plan.CHECK_STEPS):
            logits = model(input_ids=torch.tensor([sequence]), use_cache=False).logits
            sequence.append(int(logits[0, -1].argmax()))
        eager = model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
    return EagerReference(list(prompt), sequence, eager[len(prompt) - 1:].clone())


def check(reference: EagerReference, generator, quantized: bool = False) -> tuple:
    """(prefill's verdict, decode's verdict): the runtime's logits of the prompt, then of each
    of eager's tokens fed one a call, against eager's over the whole sequence, each judged
    against its row's scale (``per_row``), or within the quantized tolerance for a quantized
    .pte."""
    prompt, sequence = reference.prompt, reference.sequence
    got = [generator.prefill(prompt)]
    got += [generator.step(sequence[position], position)
            for position in range(len(prompt), len(sequence))]
    got, expected = torch.cat(got), reference.logits
    judge = _quantized_judge if quantized else _per_row_judge
    return judge(got[:1], expected[:1]), judge(got[1:], expected[1:])


def _per_row_judge(actual, expected):
    from ...pte.compare import compare_outputs

    return compare_outputs(actual, expected, per_row=True)


def _quantized_judge(actual, expected):
    """A quantized .pte against its quantized eager model (:func:`quantized_tolerance`)."""
    from ...pte.compare import compare_outputs, quantized_tolerance

    return compare_outputs(actual, expected, **quantized_tolerance(expected))
