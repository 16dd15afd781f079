"""``xnnfold hf DIR -o OUT.pte``: a transformers model saved in a local folder
(``model.save_pretrained(DIR)``; no hub access) to .pte files through xnnfold, each checked
against eager on the ExecuTorch runtime.

What is exported is the class the folder's ``config.json`` names (``architectures``), decided
from config.json alone, before torch, transformers or the weights load (:func:`plan`):

- a causal LM (``...ForCausalLM``, ``...LMHeadModel``): a generation-ready .pte, ``prefill``
  and ``decode`` over transformers' static KV cache (:mod:`xnnfold.llm`); ``--no-cache``: the
  logits of ``--tokens`` tokens, no cache;
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

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .sources import UsageError

# What a folder's class is exported as (Plan.kind).
CAUSAL_LM, WHISPER, SEQ2SEQ, TEXT_LOGITS, IMAGE_LOGITS, CLIP, TEXT_BASE, VISION_BASE = (
    "causal-lm", "whisper", "seq2seq", "text-logits", "image-logits", "clip", "text", "vision")
# Decode steps the check of a generation .pte takes after its prefill.
CHECK_STEPS = 4
_TEXT_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM")
# RoBERTa and its kin number positions from pad_token_id + 1 (transformers'
# create_position_ids_from_input_ids): that many of max_position_embeddings are never used.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert",
                            "data2vec-text", "ibert", "longformer", "mpnet",
                            "roberta-prelayernorm", "xmod", "esm", "luke"}
_KINDS = ("a causal LM (...ForCausalLM, ...LMHeadModel), Whisper, a text seq2seq model (T5, "
          "BART: ...ForConditionalGeneration), a text classifier or tagger "
          f"({', '.join('...' + h for h in _TEXT_HEADS)}), an image classifier, CLIPModel, "
          "or a base ...Model")


@dataclass
class Plan:
    """What ``xnnfold hf`` exports from a folder, read from its config.json only."""

    folder: str
    kind: str
    architecture: str
    model_type: str
    config: dict
    positions: Optional[int] = None    # the longest token input the model takes, if limited

    @property
    def parts(self) -> tuple:
        """The .pte files, by suffix ("": OUT.pte itself)."""
        return {WHISPER: ("encoder", "decoder"), SEQ2SEQ: ("encoder", "decoder"),
                CLIP: ("text", "vision")}.get(self.kind, ("",))


def _read_config(folder: str) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UsageError(f"{folder}: no config.json (save the model with save_pretrained)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: not a readable JSON config ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:120]})")
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a JSON object")
    return config


def _positions(config: dict, *keys: str) -> Optional[int]:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _kind(architecture: str, config: dict) -> Optional[str]:
    model_type = config.get("model_type", "")
    image = "image_size" in config and "num_channels" in config
    if model_type == "whisper":
        return WHISPER if architecture == "WhisperForConditionalGeneration" else None
    if architecture.endswith(("ForCausalLM", "LMHeadModel")):
        return None if config.get("is_encoder_decoder") else CAUSAL_LM
    if architecture.endswith("ForConditionalGeneration"):
        text = "vocab_size" in config and not any(k in config for k in (
            "vision_config", "audio_config", "image_size", "num_mel_bins"))
        return SEQ2SEQ if config.get("is_encoder_decoder") and text else None
    if architecture.endswith("ForImageClassification"):
        return IMAGE_LOGITS if image else None
    if architecture.endswith(_TEXT_HEADS):
        return TEXT_LOGITS if "vocab_size" in config and not config.get(
            "is_encoder_decoder") else None
    if architecture == "CLIPModel":
        return CLIP
    if architecture == "T5EncoderModel":
        return TEXT_BASE
    if architecture.endswith("Model") and not config.get("is_encoder_decoder"):
        if image:
            return VISION_BASE
        if "vocab_size" in config and not any(k in config for k in (
                "vision_config", "text_config", "audio_config")):
            return TEXT_BASE
    return None


def plan(folder: str, tokens: int = 8, cache: bool = True, max_cache: Optional[int] = None,
         max_prefill: Optional[int] = None) -> Plan:
    """What ``folder`` exports as, from its config.json alone (no torch, no weights): the
    class its ``architectures`` names. :class:`UsageError`, one line, for a class xnnfold hf
    does not export, or ``tokens`` or (a causal LM with a ``cache``) cache sizes the model
    cannot take."""
    config = _read_config(folder)
    architectures = config.get("architectures") or []
    model_type = str(config.get("model_type", "?"))
    if not architectures or not isinstance(architectures[0], str):
        raise UsageError(f"{folder}: config.json names no architecture (model type "
                         f"{model_type!r}); save the model with save_pretrained")
    architecture = architectures[0]
    kind = _kind(architecture, config)
    if kind is None:
        raise UsageError(f"{folder}: {architecture} (model type {model_type!r}) is not a class "
                         f"xnnfold hf exports: {_KINDS}")
    if kind == WHISPER:
        positions = _positions(config, "max_target_positions")
    elif kind == CLIP:
        positions = _positions(config.get("text_config") or {}, "max_position_embeddings")
    else:
        positions = _positions(config, "max_position_embeddings", "n_positions")
        if positions is not None and model_type in _POSITIONS_AFTER_PADDING:
            positions -= int(config.get("pad_token_id") or 0) + 1
    if tokens < 1:
        raise UsageError(f"--tokens {tokens}: give at least 1 token")
    if kind not in (IMAGE_LOGITS, VISION_BASE) and positions is not None and tokens > positions:
        raise UsageError(f"--tokens {tokens} is beyond the model's {positions} positions "
                         f"({architecture})")
    if kind == CAUSAL_LM and cache:
        _check_cache(positions, tokens, max_cache, max_prefill)
    return Plan(folder, kind, architecture, model_type, config, positions)


def _check_cache(positions: Optional[int], tokens: int, max_cache: Optional[int],
                 max_prefill: Optional[int]) -> None:
    from ..llm.sizes import cache_sizes

    try:
        rows, _ = cache_sizes(positions, max_cache, max_prefill)
    except ValueError as error:
        raise UsageError(str(error).replace("max_cache", "--max-cache").replace(
            "max_prefill", "--max-prefill"))
    if tokens + CHECK_STEPS > rows:
        raise UsageError(f"--tokens {tokens}: the check runs {tokens} + {CHECK_STEPS} "
                         f"positions, the cache has {rows} rows (--max-cache)")


def pte_path(output: Path, part: str) -> Path:
    return output if not part else output.with_suffix(f".{part}{output.suffix}")


def table(rows: list) -> str:
    from tabulate import tabulate

    body = [[r["part"], r["variant"], r["gemms_outside"], r["delegate_calls"],
             f"{r['pte_bytes']:,}", r["outputs"], f"{r['lower_seconds']:.1f}",
             "" if r["median_ms"] is None else f"{r['median_ms']:.3f}",
             "" if r["vs_stock"] is None else f"{r['vs_stock']:.3f}", r["written"]]
            for r in rows]
    return tabulate(body, headers=["part", "variant", "GEMMs outside", "delegate calls",
                                   ".pte bytes", "outputs vs eager", "lower s", "latency ms (median)",
                                   "vs stock", "written"], disable_numparse=True)


@dataclass
class Exported:
    """What :func:`export_folder` wrote and measured."""

    rows: list                 # one per part (or method) and variant: see table()
    notes: list                # lines to print after the table
    wrong: list                # one line per .pte whose outputs differ from eager


def export_folder(plan: Plan, output: str, compare: bool = False, tokens: int = 8,
                  attention: str = "sdpa", reps: int = 10, prefer: str = "speed",
                  check: bool = True, cache: bool = True, max_cache: Optional[int] = None,
                  max_prefill: Optional[int] = None, llm_kernels: bool = False) -> Exported:
    """Write the .pte of every part of ``plan``'s model, each checked against eager on the
    runtime unless ``check`` is False; with ``compare``, stock's lowering beside xnnfold's,
    timed. ``prefer``: xnnfold's (``XnnpackPartitioner(prefer=...)``). A causal LM is
    generation-ready unless ``cache`` is False (``max_cache``/``max_prefill``: its sizes;
    ``llm_kernels``: its cache on executorch's LLM kernels, see
    :class:`~xnnfold.XnnpackPartitioner`)."""
    from . import hf_parts

    output_path = Path(output)
    if not output_path.parent.exists():
        raise UsageError(f"{output}: folder {output_path.parent} does not exist")
    model = hf_parts.load(plan, attention)
    if plan.kind == CAUSAL_LM and cache:
        from .hf_generation import export_generation
        exported = export_generation(model, output_path, compare, tokens, reps, prefer, check,
                                     max_cache, max_prefill, llm_kernels)
    else:
        exported = Exported([], [], [])
        for part in hf_parts.parts(plan, model, tokens):
            _export_part(part, pte_path(output_path, part.name), exported, compare, reps,
                         prefer, check)
    _ratios(exported.rows)
    return exported


def _export_part(part, destination: Path, exported: Exported, compare: bool, reps: int,
                 prefer: str, check: bool) -> None:
    import torch

    from .compare import compare_outputs
    from .measure import STOCK, XNNFOLD, PteRunner, lower
    from .side_by_side import time_interleaved

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


@contextlib.contextmanager
def failing_as_usage(what: str):
    """A model transformers has but torch.export or the lowering cannot take: one line
    naming the step and the error (``--debug`` shows the traceback), not a traceback."""
    try:
        yield
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever fails, say which step and why
        raise UsageError(f"{what} failed ({type(error).__name__}: "
                         f"{(str(error).splitlines() or [''])[0][:200]})") from error


def row(part: str, variant: str, lowered, verdict, median_ms, written: str,
        gemms_outside: Optional[int] = None, delegate_calls: Optional[int] = None) -> dict:
    """One row of the table (a Lowered's counts unless given)."""
    return {"part": part, "variant": variant,
            "gemms_outside": len(lowered.gemms_outside) if gemms_outside is None
            else gemms_outside,
            "delegate_calls": lowered.delegate_calls if delegate_calls is None
            else delegate_calls,
            "pte_bytes": lowered.pte_bytes, "outputs": "not checked" if verdict is None
            else str(verdict), "lower_seconds": lowered.lower_seconds, "median_ms": median_ms,
            "written": written}


def _ratios(rows: list) -> None:
    for r in rows:
        stock = next((s for s in rows if s["part"] == r["part"] and s["variant"] == "stock"),
                     None)
        r["vs_stock"] = (r["median_ms"] / stock["median_ms"]
                         if stock and stock["median_ms"] and r["median_ms"] else None)
