"""``xnnfold hf DIR -o OUT.pte``: a transformers model saved in a local folder
(``model.save_pretrained(DIR)``; no hub access) to .pte files through xnnfold, each checked
against eager on the ExecuTorch runtime.

What is exported is the class the folder's ``config.json`` names (``architectures``), decided
from config.json alone, before torch, transformers or the weights load (:func:`plan`):

- a causal LM (``...ForCausalLM``, ``...LMHeadModel``): a generation-ready .pte, one
  ``forward`` over transformers' static KV cache (:mod:`xnnfold.export.llm`), the layout
  executorch's ``TextLLMRunner`` runs, its linears quantized with ``--quantize``, the folder's
  tokenizer copied beside it; ``--no-cache``: the logits of ``--tokens`` tokens, no cache;
- Whisper: the encoder on a full window and one decoder step, ``OUT.encoder.pte`` and
  ``OUT.decoder.pte``;
- a text seq2seq model (``...ForConditionalGeneration`` with ``is_encoder_decoder``: T5, BART,
  ...): the encoder (``input_ids`` + ``attention_mask``) and one decoder step (``--tokens``
  tokens over the encoder's states, logits), ``OUT.encoder.pte`` and ``OUT.decoder.pte``;
- a classifier or tagger of text (``...ForSequenceClassification``,
  ``...ForTokenClassification``, ``...ForMaskedLM``): logits of ``input_ids`` +
  ``attention_mask``; an image classifier (``...ForImageClassification``): logits of one image;
- CLIP (``CLIPModel``): its two encoders, ``OUT.text.pte`` (text embeddings) and
  ``OUT.vision.pte`` (image embeddings);
- a base model (``...Model``; ``T5EncoderModel``): the last hidden state, of one image when its
  config has ``image_size`` and ``num_channels``, else of ``input_ids`` + ``attention_mask``.

Anything else is refused with one line naming the class. Random example inputs (seeded); a
text input's mask pads its last token, so the check covers the mask. With ``--compare``, each
program is also lowered with stock executorch and both .pte files are timed on the runtime
(interleaved rounds). Why not optimum-executorch's export: see the README (*Hugging Face
models*).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...usage import UsageError
from .plan import CAUSAL_LM, Plan
from .rows import Exported, failing_as_usage, pte_path, ratios, row


def export_folder(plan: Plan, output: str, compare: bool = False, tokens: int = 8,
                  attention: str = "sdpa", reps: int = 10, prefer: str = "speed",
                  check: bool = True, cache: bool = True, max_cache: Optional[int] = None,
                  max_prefill: Optional[int] = None, llm_kernels: bool = False,
                  quantize: Optional[str] = None) -> Exported:
    """Write the .pte of every part of ``plan``'s model, each checked against eager on the
    runtime unless ``check`` is False; with ``compare``, stock's lowering beside xnnfold's,
    timed. ``prefer``: xnnfold's (``XnnpackPartitioner(prefer=...)``). A causal LM is
    generation-ready unless ``cache`` is False (``max_cache``/``max_prefill``: its sizes;
    ``llm_kernels``: its cache on executorch's LLM kernels, see
    :class:`~xnnfold.XnnpackPartitioner`; ``quantize``: its linears, a scheme of
    :mod:`xnnfold.export.llm.quantize`)."""
    from . import parts as hf_parts

    output_path = Path(output)
    if not output_path.parent.exists():
        raise UsageError(f"{output}: folder {output_path.parent} does not exist")
    check_generation_options(plan, str(output_path), cache, quantize)
    model = hf_parts.load(plan, attention)
    if plan.kind == CAUSAL_LM and cache:
        from .generation import export_generation
        exported = export_generation(model, output_path, compare, tokens, reps, prefer, check,
                                     max_cache, max_prefill, llm_kernels, quantize,
                                     plan.folder)
    else:
        exported = Exported([], [], [])
        for part in hf_parts.parts(plan, model, tokens):
            _export_part(part, pte_path(output_path, part.name), exported, compare, reps,
                         prefer, check)
    ratios(exported.rows)
    return exported


def check_generation_options(plan: Plan, output: str, cache: bool, quantize: Optional[str]
                             ) -> None:
    """One line, before any work, for ``--quantize`` on what is not a generation .pte, or a
    causal LM's tokenizer that would overwrite another beside ``output``."""
    from ..llm.text import copy_conflicts

    generation = plan.kind == CAUSAL_LM and cache
    if quantize is not None and not generation:
        raise UsageError(f"--quantize {quantize}: for a causal LM's generation .pte only "
                         f"({plan.architecture}{' with --no-cache' if not cache else ''}); "
                         "`xnnfold lower --quantize` quantizes other programs")
    if generation:
        conflicts = copy_conflicts(plan.folder, Path(output).parent)
        if conflicts:
            raise UsageError(f"{conflicts[0]} exists and is not {plan.folder}'s tokenizer: "
                             "write the .pte to another folder (its tokenizer goes beside it)")


def _export_part(part, destination: Path, exported: Exported, compare: bool, reps: int,
                 prefer: str, check: bool) -> None:
    import torch

    from ...pte.compare import compare_outputs
    from ...pte import STOCK, XNNFOLD, PteRunner, lower
    from ...pte.timing import time_interleaved

    with torch.no_grad():
        expected = part.module(*part.inputs)
    what = f"{part.name or 'the model'} of {destination.name}"
    with failing_as_usage(f"torch.export of {what}"):
        program = torch.export.export(part.module, part.inputs)
    variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
    with failing_as_usage(f"lowering {what}"):
        lowered = {variant: lower(program, variant,
                                  {"prefer": prefer} if variant == XNNFOLD else None)
                   for variant in variants}
    destination.write_bytes(lowered[XNNFOLD].pte)
    runners = {v: PteRunner(low.pte) for v, low in lowered.items()}
    times = time_interleaved(runners, part.inputs, reps) if compare else {}
    for variant, low in lowered.items():
        verdict = compare_outputs(runners[variant].run(part.inputs), expected) \
            if check else None
        if verdict is not None and not verdict.ok and variant == XNNFOLD:
            exported.wrong.append(f"{destination}: {verdict}")
        median = sorted(times[variant])[len(times[variant]) // 2] if times else None
        exported.rows.append(row(part.name or "model", variant, low, verdict, median,
                                 str(destination) if variant == XNNFOLD else ""))
