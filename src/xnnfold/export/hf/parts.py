"""The programs ``xnnfold hf`` exports for each kind of model (:mod:`xnnfold.export.hf`'s
plan): the class config.json names, loaded from the folder, wrapped so that tensors go in and
the output that class is for comes out, with seeded example inputs. (A causal LM's
generation-ready form is :mod:`xnnfold.export.llm`'s.)"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from . import plan as hf_plan
from ...usage import OptionError, UsageError, first_line


@dataclass
class Part:
    """One program to export: its name (the .pte's suffix), module and example inputs."""

    name: str
    module: nn.Module
    inputs: tuple


class _Call(nn.Module):
    """``method(**dict(zip(names, tensors)), **fixed)``'s output ``output``: a transformers
    model with tensors in and one tensor out, as export wants."""

    def __init__(self, model: nn.Module, names: tuple, output: str, method: str = "forward",
                 **fixed):
        super().__init__()
        self.model, self.names, self.output, self.method = model, names, output, method
        parameters = inspect.signature(getattr(model, method)).parameters
        # use_cache=False where the model takes it: no cache object built, none returned
        self.fixed = {**({"use_cache": False} if "use_cache" in parameters else {}), **fixed}

    def forward(self, *tensors):
        call = getattr(self.model, self.method)
        return getattr(call(**dict(zip(self.names, tensors)), **self.fixed, return_dict=True),
                       self.output)


def input_shapes(part: Part) -> str:
    """What the .pte of ``part`` takes, e.g. ``input_ids (1, 8) int64, attention_mask (1, 8)
    int64``: its inputs by name, shape and dtype."""
    module = part.module
    names = module.names if isinstance(module, _Call) else \
        tuple(inspect.signature(module.forward).parameters)
    return ", ".join(f"{name} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
                     for name, t in zip(names, part.inputs))


AUTO = "auto"


def choose_attention(cls, asked: str) -> tuple:
    """(transformers' ``attn_implementation`` to load ``cls`` with, what to say about it):
    ``asked`` itself, or for ``auto`` SDPA where transformers has it for the class
    (``_supports_sdpa``) and eager attention where it has not (Gemma2: soft-capping; BLOOM,
    MPT: ALiBi)."""
    sdpa = bool(getattr(cls, "_supports_sdpa", False))
    if asked != AUTO:
        return asked, f"{cls.__name__}: transformers' {asked} attention (--attention {asked})"
    if sdpa:
        return "sdpa", f"{cls.__name__}: transformers' sdpa attention (--attention auto)"
    return "eager", (f"{cls.__name__}: transformers' eager attention (--attention auto: "
                     "transformers has no SDPA attention for this class)")


def load(plan: "hf_plan.Plan", attention: str, quantize: Optional[str] = None) -> tuple:
    """(the class config.json names, with the folder's weights as float32, in eval mode; which
    attention it was loaded with and why, and in which dtype the folder has its weights when
    that is not float32). ``quantize``: its linears quantized by that scheme as the weights are
    read (:mod:`.streaming`) where the folder allows it (else its note says why, and the
    export quantizes a copy).

    float32 whatever the folder holds: transformers 5 loads a checkpoint in its own dtype
    (``dtype="auto"``), and models are published in bfloat16, whose GEMMs executorch 1.5.1's
    XNNPACK configs decline: every linear of such a program runs on the portable kernels."""
    from ..transformers import import_transformers

    tf = import_transformers()
    try:
        cls = getattr(tf, plan.architecture)
    except AttributeError:
        raise UsageError(f"{plan.folder}: transformers {tf.__version__} has no class "
                         f"{plan.architecture}")
    implementation, note = choose_attention(cls, attention)
    if implementation == "sdpa" and not getattr(cls, "_supports_sdpa", False):
        raise OptionError(f"{plan.folder}: transformers {tf.__version__} has no SDPA "
                          f"attention for {plan.architecture}: use `attention=eager` (or "
                          "auto)")
    if quantize is not None:
        model, said = _load_quantized(tf, cls, plan, implementation, quantize)
        if model is not None:
            return model, note + said + _stored_dtype(plan)
        note += said
    progress = tf.utils.logging.is_progress_bar_enabled()
    tf.utils.logging.disable_progress_bar()       # "Loading weights" on stderr, per tensor
    try:
        model = cls.from_pretrained(plan.folder, local_files_only=True,
                                    attn_implementation=implementation, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise UsageError(f"{plan.folder}: {plan.architecture}.from_pretrained failed "
                         f"({first_line(error)})")
    finally:
        if progress:
            tf.utils.logging.enable_progress_bar()
    return model.eval(), note + _stored_dtype(plan)


def _stored_dtype(plan: "hf_plan.Plan") -> str:
    stored = plan.config.get("dtype") or plan.config.get("torch_dtype")
    if stored in (None, "float32", "auto"):
        return ""
    return f"; its {stored} weights loaded as float32 (XNNPACK 1.5.1 delegates no {stored} GEMM)"


def _load_quantized(tf, cls, plan: "hf_plan.Plan", implementation: str, scheme: str) -> tuple:
    """(the model read and quantized module by module, or None; what to say about it): when
    the folder cannot be read so, why (the model is then loaded whole)."""
    from .streaming import NotStreamable, load_quantized

    try:
        config = tf.AutoConfig.from_pretrained(plan.folder, local_files_only=True)
        return (load_quantized(cls, plan.folder, config, implementation, scheme),
                f"; its linears quantized {scheme} as their weights were read")
    except NotStreamable as reason:
        return None, (f"; its weights loaded whole, then quantized {scheme} (not as they "
                      f"were read: {reason})")


def _text(config, tokens: int) -> tuple:
    """Token ids and a mask that pads the last token (when there are two or more)."""
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    mask = torch.ones(1, tokens, dtype=torch.long)
    if tokens > 1:
        mask[0, -1] = 0
    return ids, mask


def _image(config) -> torch.Tensor:
    size = config.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return torch.randn(1, config.num_channels, height, width)


def parts(plan: "hf_plan.Plan", model: nn.Module, tokens: int) -> list:
    """The programs of ``model`` (loaded by :func:`load`) for ``plan``'s kind, except a causal
    LM's generation form: a causal LM here is its logits of ``tokens`` tokens, no cache."""
    torch.manual_seed(0)
    config, kind = model.config, plan.kind
    if kind == hf_plan.WHISPER:
        frames = 2 * config.max_source_positions
        encoder = _Call(model.model.encoder, ("input_features",), "last_hidden_state")
        return [Part("encoder", encoder, (torch.randn(1, config.num_mel_bins, frames),)),
                Part("decoder", WhisperDecoderStep(model).eval(),
                     (torch.randint(0, config.vocab_size, (1, tokens)),
                      torch.randn(1, config.max_source_positions, config.d_model)))]
    if kind == hf_plan.CAUSAL_LM:
        return [Part("", _Call(model, ("input_ids",), "logits"),
                     (torch.randint(0, config.vocab_size, (1, tokens)),))]
    if kind == hf_plan.SEQ2SEQ:
        ids, mask = _text(config, tokens)
        encoder = _Call(model.get_encoder(), ("input_ids", "attention_mask"),
                        "last_hidden_state")
        with torch.no_grad():
            states = encoder(ids, mask)
        decoder = _Call(model, ("decoder_input_ids", "encoder_outputs"), "logits")
        return [Part("encoder", encoder, (ids, mask)),
                Part("decoder", _Seq2SeqDecoderStep(decoder),
                     (torch.randint(0, config.vocab_size, (1, tokens)), states))]
    if kind in (hf_plan.TEXT_LOGITS, hf_plan.TEXT_BASE):
        output = "logits" if kind == hf_plan.TEXT_LOGITS else "last_hidden_state"
        return [Part("", _Call(model, ("input_ids", "attention_mask"), output),
                     _text(config, tokens))]
    if kind in (hf_plan.IMAGE_LOGITS, hf_plan.VISION_BASE):
        output = "logits" if kind == hf_plan.IMAGE_LOGITS else "last_hidden_state"
        return [Part("", _Call(model, ("pixel_values",), output), (_image(config),))]
    if kind == hf_plan.CLIP:
        text = _Call(model, ("input_ids", "attention_mask"), "pooler_output",
                     method="get_text_features")
        vision = _Call(model, ("pixel_values",), "pooler_output", method="get_image_features")
        return [Part("text", text, _text(config.text_config, tokens)),
                Part("vision", vision, (_image(config.vision_config),))]
    raise AssertionError(f"no parts for kind {kind!r}")   # plan() admits no other kind


class _Seq2SeqDecoderStep(nn.Module):
    """One decoder step of a seq2seq model: tokens over the encoder's states (all valid),
    logits out, through the model's own forward (T5 scales a tied head's input there)."""

    def __init__(self, call: _Call):
        super().__init__()
        self.call = call

    def forward(self, tokens, states):
        return self.call(tokens, (states,))


class WhisperDecoderStep(nn.Module):
    """One decoder step: the tokens so far over the encoder's states, logits out (no cache)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        # the decoder and its head only (proj_out is tied to the decoder's token table)
        self.decoder, self.proj_out = model.model.decoder, model.proj_out

    def forward(self, tokens, states):
        hidden = self.decoder(input_ids=tokens, encoder_hidden_states=states,
                              use_cache=False, return_dict=True).last_hidden_state
        return self.proj_out(hidden)
