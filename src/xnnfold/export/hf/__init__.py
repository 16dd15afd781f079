"""``xnnfold hf DIR -o OUT.pte``: a transformers model saved in a local folder
(``model.save_pretrained(DIR)``; no hub access) to .pte files through xnnfold, each checked
against eager on the ExecuTorch runtime.

What is exported is the class the folder's ``config.json`` names (``architectures``), decided
from config.json alone, before torch, transformers or the weights load (:func:`plan`):

- a causal LM (``...ForCausalLM``, ``...LMHeadModel``): a generation-ready .pte, one
  ``forward`` over transformers' static KV cache (:mod:`xnnfold.export.llm`), the layout
  executorch's ``TextLLMRunner`` runs, its linears quantized with ``--quantize``, the folder's
  tokenizer copied beside it; ``--no-cache``: the logits of ``--tokens`` tokens, no cache;
- Whisper, and a text seq2seq model whose decoder has BART's or T5's cross-attention (BART,
  mBART, Marian, Pegasus; T5, Flan-T5, mT5): a generation-ready .pte
  (:mod:`xnnfold.export.seq2seq`): ``encoder`` once per input, returning every decoder layer's
  cross-attention keys and values, and ``text_decoder`` one token per call over a
  self-attention cache, the layout executorch's speech runner calls; a tied head's table in
  ``OUT.ptd`` beside it;
- an image-text-to-text model (LLaVA, SmolVLM): the .pte executorch's ``MultimodalRunner`` runs,
  methods ``vision_encoder``, ``token_embedding``, ``text_decoder``
  (:mod:`xnnfold.export.multimodal`), the folder's tokenizer copied beside it; an
  audio-text-to-text model (Voxtral) the same way with ``audio_encoder`` (:mod:`.audio`);
- ``--no-cache``, and a seq2seq model whose cross-attention is neither: the encoder (Whisper:
  a full window; text: ``input_ids`` + ``attention_mask``) and one decoder step (``--tokens``
  tokens over the encoder's states, logits), ``OUT.encoder.pte`` and ``OUT.decoder.pte``;
- a classifier or tagger of text (``...ForSequenceClassification``,
  ``...ForTokenClassification``, ``...ForMaskedLM``): logits of ``input_ids`` +
  ``attention_mask``; an image classifier (``...ForImageClassification``): logits of one image;
- CLIP (``CLIPModel``): its two encoders, ``OUT.text.pte`` (text embeddings) and
  ``OUT.vision.pte`` (image embeddings);
- a base model (``...Model``; ``T5EncoderModel``): the last hidden state, of one image when its
  config has ``image_size`` and ``num_channels``, else of ``input_ids`` + ``attention_mask``.

Anything else is refused with one line naming the class. Random example inputs (seeded); a
text input's mask pads its last token, so the check covers the mask. Each .pte but a
generation .pte takes its example inputs' shapes only (a text of ``--tokens`` tokens), and the
notes say them: exported with a dynamic text length, BERT, T5, CLIP's text encoder and GPT-2
lowered with none of xnnfold's rewrites (``xnnfold bench hf-text-length``). With
``--compare``, each program is also lowered with stock executorch and both .pte files are
timed on the runtime (interleaved rounds). Why not optimum-executorch's export: it pins
transformers 5.0.0rc1 (docs/speech.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...usage import OptionError, UsageError
from .plan import AUDIO_TEXT, CAUSAL_LM, IMAGE_TEXT, MULTIMODAL, SEQ2SEQ, WHISPER, Plan
from .rows import Exported, failing_as_usage, pte_path, ratios, row


def export_folder(plan: Plan, output: str, compare: bool = False, tokens: int = 8,
                  attention: str = "auto", reps: int = 10, prefer: str = "speed",
                  check: bool = True, cache: bool = True, max_cache: Optional[int] = None,
                  max_prefill: Optional[int] = None, llm_kernels: bool = False,
                  quantize: Optional[str] = None, force: bool = False) -> Exported:
    """Write the .pte of every part of ``plan``'s model, each checked against eager on the
    runtime unless ``check`` is False; with ``compare``, stock's lowering beside xnnfold's,
    timed. ``prefer``: xnnfold's (``XnnpackPartitioner(prefer=...)``). A causal LM is
    generation-ready unless ``cache`` is False (``max_cache``/``max_prefill``: its sizes;
    ``llm_kernels``: its cache on executorch's LLM kernels, see
    :class:`~xnnfold.XnnpackPartitioner`; ``quantize``: its linears, a scheme of
    :mod:`xnnfold.export.llm.quantize`). A causal LM whose export cannot fit this machine's
    memory is refused before its weights load (:mod:`.fits`) unless ``force``."""
    from . import parts as hf_parts

    output_path = Path(output)
    if not output_path.parent.exists():
        raise UsageError(f"{output}: folder {output_path.parent} does not exist")
    check_generation_options(plan, str(output_path), cache, quantize)
    if not force:
        from .fits import check_plan
        check_plan(plan, quantize, cache, max_cache, max_prefill)
    generation = plan.kind == CAUSAL_LM and cache
    model, attention_note = hf_parts.load(plan, attention, quantize if generation else None)
    if plan.kind == CAUSAL_LM and cache:
        from .generation import export_generation
        exported = export_generation(model, output_path, compare, tokens, reps, prefer, check,
                                     max_cache, max_prefill, llm_kernels, quantize,
                                     plan.folder)
    elif plan.kind == IMAGE_TEXT:
        from .multimodal import export_multimodal_generation
        exported = export_multimodal_generation(model, output_path, compare, tokens, reps,
                                                prefer, check, max_cache, max_prefill,
                                                plan.folder)
    elif plan.kind == AUDIO_TEXT:
        from .audio import export_audio_generation
        exported = export_audio_generation(model, output_path, compare, tokens, reps, prefer,
                                           check, max_cache, max_prefill, plan.folder)
    elif plan.kind in (WHISPER, SEQ2SEQ) and cache and _cross_attention(model):
        from .seq2seq import export_seq2seq_generation
        exported = export_seq2seq_generation(model, output_path, plan.folder, compare, tokens,
                                             reps, prefer, check, max_cache)
    else:
        exported = Exported([], [], [])
        if plan.kind == SEQ2SEQ and cache:
            exported.notes.append(f"{plan.architecture}: its decoder has neither BART's "
                                  "cross-attention (encoder_attn) nor T5's: exported as the "
                                  "encoder and one decoder step, without a cache")
        for part in hf_parts.parts(plan, model, tokens):
            destination = pte_path(output_path, part.name)
            _export_part(part, destination, exported, compare, reps, prefer, check)
            # exported with fixed shapes: a dynamic text length lowered with none of
            # xnnfold's rewrites (xnnfold bench hf-text-length: BERT, T5, CLIP, GPT-2 twice
            # the ops outside delegates, three times the delegate calls)
            tokens_in = any(not t.is_floating_point() for t in part.inputs)
            exported.notes.append(f"{destination}: takes {hf_parts.input_shapes(part)}, "
                                  "these shapes only" + (f" (--tokens {tokens} sets the "
                                                         "text's length)" if tokens_in else ""))
    ratios(exported.rows)
    exported.notes.insert(0, attention_note)
    return exported


def _cross_attention(model) -> bool:
    from ..seq2seq.export import cross_attentions

    try:
        cross_attentions(model)
    except ValueError:
        return False
    return True


def check_generation_options(plan: Plan, output: str, cache: bool, quantize: Optional[str]
                             ) -> None:
    """One line, before any work, for ``--quantize`` on what is not a generation .pte, or a
    causal LM's or a text encoder-decoder's tokenizer that would overwrite another beside
    ``output``."""
    from ..llm.text import copy_conflicts

    generation = plan.kind == CAUSAL_LM and cache
    if quantize is not None and not generation:
        raise OptionError(f"`quantize` {quantize}: for a causal LM's generation .pte only "
                          f"({plan.architecture}{' with `cache=False`' if not cache else ''}); "
                          "`xnnfold lower --quantize` quantizes other programs")
    # the tokenizer goes beside the .pte
    if generation or (plan.kind in (SEQ2SEQ, *MULTIMODAL) and cache):
        conflicts = copy_conflicts(plan.folder, Path(output).parent)
        if conflicts:
            raise UsageError(f"{conflicts[0]} exists and is not {plan.folder}'s tokenizer: "
                             "write the .pte to another folder (its tokenizer goes beside it)")


def _export_part(part, destination: Path, exported: Exported, compare: bool, reps: int,
                 prefer: str, check: bool) -> None:
    """Every output judged at the scale of its row (``compare_outputs(per_row=True)``, as the
    generation check judges logits): the elements of a row (logits, a token's hidden state, an
    embedding) are computed from the same inputs, so their rounding follows the row's
    magnitude, not each one's own. Element-wise, a T5 with large activations
    (``initializer_factor=3``) was WRONG at 3e-5 on a value of 0.016 (4.5e-6 of its row's
    scale), as were a GPT-2's logits without a cache, where stock's .pte had the same error."""
    import torch

    from ...pte.compare import compare_outputs
    from ...pte import STOCK, XNNFOLD, PteRunner, lower
    from ...pte.files import write_atomically
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
    write_atomically(destination, lowered[XNNFOLD].pte)  # whole, or the name as it was
    runners = {v: PteRunner(low.pte) for v, low in lowered.items()}
    times = time_interleaved(runners, part.inputs, reps) if compare else {}
    for variant, low in lowered.items():
        verdict = (compare_outputs(runners[variant].run(part.inputs), expected, per_row=True)
                   if check else None)
        if verdict is not None and not verdict.ok and variant == XNNFOLD:
            exported.wrong.append(f"{destination}: {verdict}")
        median = sorted(times[variant])[len(times[variant]) // 2] if times else None
        exported.rows.append(row(part.name or "model", variant, low, verdict, median,
                                 str(destination) if variant == XNNFOLD else ""))
