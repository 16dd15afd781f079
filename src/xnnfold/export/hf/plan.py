"""What ``xnnfold hf`` exports a folder as, decided from its ``config.json`` alone, before
torch, transformers or the weights load (:func:`plan`): the kinds :mod:`xnnfold.export.hf`
lists, or one line (:class:`~xnnfold.models.sources.UsageError`) naming a class it does not
export, or ``--tokens`` / cache sizes the model cannot take.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...usage import OptionError, UsageError
from ..seq2seq.t5 import positions as relative_positions

# What a folder's class is exported as (Plan.kind).
CAUSAL_LM, WHISPER, SEQ2SEQ, TEXT_LOGITS, IMAGE_LOGITS, CLIP, TEXT_BASE, VISION_BASE = (
    "causal-lm", "whisper", "seq2seq", "text-logits", "image-logits", "clip", "text", "vision")
# an image-text-to-text model, for executorch's MultimodalRunner (xnnfold.export.multimodal)
IMAGE_TEXT = "image-text-to-text"
IMAGE_TEXT_CLASSES = ("LlavaForConditionalGeneration", "SmolVLMForConditionalGeneration")
# an audio-text-to-text model, for the same runner (xnnfold.export.multimodal.audio)
AUDIO_TEXT = "audio-text-to-text"
AUDIO_TEXT_CLASSES = ("VoxtralForConditionalGeneration",)
# the kinds executorch's MultimodalRunner runs
MULTIMODAL = (IMAGE_TEXT, AUDIO_TEXT)
# why a vision-language family has none (docs/multimodal.md), by model type
_NO_IMAGE_TEXT = {"gemma3": "its image tokens attend to each other both ways in transformers' "
                  "prefill, and executorch's MultimodalRunner calls text_decoder(embeddings, "
                  "positions) with nothing saying which rows are an image's"}
# Decode steps the check of a generation .pte takes after its prefill.
CHECK_STEPS = 4
_TEXT_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM")
# RoBERTa and its kin number positions from pad_token_id + 1 (transformers'
# create_position_ids_from_input_ids): that many of max_position_embeddings are never used.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert",
                            "data2vec-text", "ibert", "longformer", "mpnet",
                            "roberta-prelayernorm", "xmod", "esm", "luke"}
# Causal LMs whose state between tokens is not (only) a KV cache of attention: transformers'
# static cache has no rows for it, and the generation export failed after loading the weights
# (transformers 5.25, 11-25 s: "does not support ... scaled_dot_product_attention", with
# --attention eager "'MambaConfig' object has no attribute 'num_attention_heads'", hybrids
# "'LinearAttentionLayer' object has no attribute 'keys'"). Told from config.json: the model
# types of recurrent families, the layer kinds of hybrid ones, the keys of a state-space or
# convolution state.
_RECURRENT_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm")
_LAYER_LISTS = ("layer_types", "block_types", "layers_block_type")
_STATE_LAYERS = ("linear_attention", "conv", "hybrid", "hybrid_sliding", "recurrent", "mamba")
_STATE_KEYS = ("mamba_d_state", "ssm_state_size", "state_size", "conv_L_cache", "lru_width")
_KINDS = ("a causal LM (...ForCausalLM, ...LMHeadModel), Whisper, a text seq2seq model (T5, "
          "BART: ...ForConditionalGeneration), a text classifier or tagger "
          f"({', '.join('...' + h for h in _TEXT_HEADS)}), an image classifier, CLIPModel, "
          "or a base ...Model; image-text-to-text: " + ", ".join(IMAGE_TEXT_CLASSES) +
          "; audio-text-to-text: " + ", ".join(AUDIO_TEXT_CLASSES))


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
    if architecture in IMAGE_TEXT_CLASSES:
        return IMAGE_TEXT
    if architecture in AUDIO_TEXT_CLASSES:
        return AUDIO_TEXT
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


def _state_besides_a_kv_cache(config: dict) -> Optional[str]:
    """What a causal LM's config says it keeps between tokens besides a KV cache of
    attention, or None."""
    for source in (config, config.get("text_config") or {}):
        if source.get("model_type") in _RECURRENT_TYPES:
            return "a recurrent state"
        for key in _LAYER_LISTS:
            kinds = source.get(key)
            found = sorted({k for k in kinds if k in _STATE_LAYERS}) if isinstance(
                kinds, list) else []
            if found:
                return f"the state of its {', '.join(found)} layers ({key})"
        key = next((k for k in _STATE_KEYS if k in source), None)
        if key is not None:
            return f"a state-space or convolution state ({key})"
    return None


def plan(folder: str, tokens: int = 8, cache: bool = True, max_cache: Optional[int] = None,
         max_prefill: Optional[int] = None, llm_kernels: bool = False) -> Plan:
    """What ``folder`` exports as, from its config.json alone (no torch, no weights): the
    class its ``architectures`` names. :class:`UsageError`, one line, for a class xnnfold hf
    does not export, ``tokens`` or (a causal LM with a ``cache``) cache sizes the model
    cannot take, or options of a KV cache (``max_cache``, ``max_prefill``, ``llm_kernels``)
    for an export that has none."""
    config = _read_config(folder)
    architectures = config.get("architectures") or []
    model_type = str(config.get("model_type", "?"))
    if not architectures or not isinstance(architectures[0], str):
        raise UsageError(f"{folder}: config.json names no architecture (model type "
                         f"{model_type!r}); save the model with save_pretrained")
    architecture = architectures[0]
    kind = _kind(architecture, config)
    if kind is None and "vision_config" in config and "text_config" in config:
        why = f" ({_NO_IMAGE_TEXT[model_type]})" if model_type in _NO_IMAGE_TEXT else ""
        raise UsageError(f"{folder}: {architecture} (model type {model_type!r}) has no "
                         f"image-text-to-text export yet{why}; supported: "
                         f"{', '.join(IMAGE_TEXT_CLASSES)}")
    if kind is None:
        raise UsageError(f"{folder}: {architecture} (model type {model_type!r}) is not a class "
                         f"xnnfold hf exports: {_KINDS}")
    if kind == WHISPER:
        positions = _positions(config, "max_target_positions")
    elif kind in (CLIP, *MULTIMODAL):
        positions = _positions(config.get("text_config") or {}, "max_position_embeddings")
    else:
        positions = _positions(config, "max_position_embeddings", "n_positions")
        if positions is not None and model_type in _POSITIONS_AFTER_PADDING:
            positions -= int(config.get("pad_token_id") or 0) + 1
        if positions is None and kind == SEQ2SEQ and cache:    # T5's, relative: the .pte's
            positions = relative_positions(config)
    if tokens < 1:
        raise OptionError(f"`tokens` {tokens}: give at least 1 token")
    if kind not in (IMAGE_LOGITS, VISION_BASE) and positions is not None and tokens > positions:
        raise OptionError(f"`tokens` {tokens} is beyond the model's {positions} positions "
                         f"({architecture})")
    cache_options = [option for option, given in (
        ("`max_cache`", max_cache is not None), ("`max_prefill`", max_prefill is not None),
        ("`llm_kernels=True`", llm_kernels)) if given]
    if kind == CAUSAL_LM and cache:
        state = _state_besides_a_kv_cache(config)
        if state is not None:
            raise OptionError(f"{folder}: {architecture} (model type {model_type!r}) keeps "
                              f"{state} between tokens: a generation .pte holds a KV cache of "
                              "attention only (`cache=False` exports its logits without a "
                              "cache)")
        _check_cache(positions, tokens, max_cache, max_prefill)
    elif kind in (WHISPER, SEQ2SEQ) and cache and max_cache is not None and \
            not CHECK_STEPS + 1 <= max_cache <= (positions or max_cache):
        raise OptionError(f"`max_cache` {max_cache}: {CHECK_STEPS + 1} (the check's steps) "
                          f"to the decoder's {positions} positions")
    if kind in MULTIMODAL and (not cache or llm_kernels):
        raise OptionError(f"`{'cache=False' if not cache else 'llm_kernels=True'}`: "
                          f"{architecture}'s .pte for executorch's MultimodalRunner has a KV "
                          "cache on XNNPACK (`max_cache`, `max_prefill` are its options)")
    if kind in MULTIMODAL:
        _check_cache(positions, tokens, max_cache, max_prefill)
    _refuse_unused(cache_options, kind, cache, architecture)
    return Plan(folder, kind, architecture, model_type, config, positions)


def _refuse_unused(options: list, kind: str, cache: bool, architecture: str) -> None:
    """Options of a KV cache (``options``: those given) that the export would ignore: one line
    rather than an export without them."""
    if kind in (WHISPER, SEQ2SEQ) and cache:
        options = [o for o in options if o != "`max_cache`"]   # its decoder's own cache
    if not options or (kind in (CAUSAL_LM, *MULTIMODAL) and cache):
        return
    if not cache and kind in (CAUSAL_LM, WHISPER, SEQ2SEQ):
        why = "options of a KV cache; `cache=False` exports without one"
    elif kind in (WHISPER, SEQ2SEQ):
        why = (f"options of a causal LM's KV cache; {architecture}'s generation .pte takes "
               "`max_cache` only")
    else:
        why = (f"options of a KV cache; {architecture} has none (a causal LM's generation "
               ".pte has one)")
    raise OptionError(f"{' and '.join(options)}: {why}")


# the options cache_sizes' messages name (as keyword arguments)
_MENTIONED = re.compile(r"\b(max_cache|max_prefill)\b")


def as_options(text: str) -> str:
    """:func:`~xnnfold.export.llm.sizes.cache_sizes`' words in the command's options."""
    return text.replace("max_cache", "--max-cache").replace("max_prefill", "--max-prefill")


def _check_cache(positions: Optional[int], tokens: int, max_cache: Optional[int],
                 max_prefill: Optional[int]) -> None:
    from ..llm.sizes import cache_sizes

    try:
        rows, _ = cache_sizes(positions, max_cache, max_prefill)
    except ValueError as error:
        raise OptionError(_MENTIONED.sub(r"`\1`", str(error)))
    if tokens + CHECK_STEPS > rows:
        raise OptionError(f"`tokens` {tokens}: the check runs {tokens} + {CHECK_STEPS} "
                          f"positions, the cache has {rows} rows (`max_cache`)")
