"""A transformers encoder-decoder model (Whisper, BART and the models that copy their attention)
as the two programs executorch's speech runner calls (``extension/asr/runner/
seq2seq_runner.cpp``; optimum-executorch's Whisper export has the same methods):

- ``encoder(inputs)`` -> one tensor: Whisper's log-mel window ``(1, mels, frames)``, or a text
  model's ``input_ids (1, T)`` (``1 <= T <=`` its positions). It returns the **cross-attention
  keys and values of every decoder layer**, computed here once per input, packed
  ``[2 * layers * heads, source, head_dim]``: layer ``l``'s keys are rows ``[2 l H, (2 l + 1) H)``,
  its values the next ``H`` rows, each head ``[source, head_dim]`` as the attention reads it;
- ``text_decoder(input_ids (1, 1), encoder_output, cache_position (1,))`` -> logits
  ``(1, 1, V)``: one token at ``cache_position``, the encoder's output handed back as it came
  out (the runner does exactly that), the self-attention keys and values in a static cache of
  ``max_cache`` rows that are this method's own mutable buffers.

No state passes between the methods through memory: all the decoder needs of the encoder is its
input, so a runner that gives each method an arena of its own (executorch's ``Module`` does)
runs it right, and the decoder's cache is written and read by the decoder alone.

Why the cross keys/values come out of ``encoder`` (whisper-tiny's dims: a decoder step reads
~113 MB of weights and 18 MB of cross keys/values; it is memory-bound):

- recomputed from the encoder's states at every token (optimum-executorch 1.1.0 on CPU): two
  ``1500 x 384 x 384`` GEMMs per layer and token, and the states read for them;
- computed by the decoder at ``cache_position == 0`` into a buffer the later steps read: needs
  ``torch.cond`` (XNNPACK takes no control flow: both branches would run on portable or split
  the graph), or a mutable buffer written at one call and read at the next, right only while no
  other method or runner touches that memory;
- returned by ``encoder``: the runner's contract as it is, no control flow, and the decoder
  step reads each layer's keys and values once. The cost: the encoder's output is
  ``2 * layers`` times its states (18 MB at whisper-tiny's dims), written once per window.

The decoder runs through the model's own ``forward`` (its head, a logits bias, an embedding
scale: whatever the class does), with transformers' ``StaticCache`` for self-attention and a
cross-attention cache already filled with the packed keys and values.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from ..fake_weights import export_with_fake_weights
from . import t5

ENCODER, DECODER = "encoder", "text_decoder"
_PROJECTIONS = ("k_proj", "v_proj", "num_heads", "head_dim")


def cross_attentions(model) -> list:
    """``(keys, values, heads, head_dim)`` of each decoder layer's cross-attention: the key and
    value projections of BART's ``encoder_attn`` (Whisper, BART, Marian, Pegasus...) or of
    T5's ``EncDecAttention`` (:mod:`.t5`); ValueError for a model whose decoder has neither."""
    decoder = model.get_decoder()
    found = [getattr(layer, "encoder_attn", None) for layer in getattr(decoder, "layers", [])]
    if found and all(a is not None and all(hasattr(a, n) for n in _PROJECTIONS)
                     for a in found):
        return [(a.k_proj, a.v_proj, a.num_heads, a.head_dim) for a in found]
    found = t5.cross_attentions(model)
    if found is None:
        raise ValueError(f"{type(model).__name__}: its decoder layers have no encoder_attn with "
                         "k_proj and v_proj (Whisper's and BART's cross-attention) nor T5's "
                         "EncDecAttention")
    return found


class EncoderWithCrossKV(nn.Module):
    """The model's encoder, then every decoder layer's cross-attention key and value
    projections of its states, packed (see the module's docstring)."""

    def __init__(self, model, input_name: str):
        super().__init__()
        self.encoder = model.get_encoder()
        attentions = cross_attentions(model)
        self.projections = nn.ModuleList(nn.ModuleList(a[:2]) for a in attentions)
        self.shapes = [a[2:] for a in attentions]
        self.input_name = input_name

    def forward(self, inputs):
        states = self.encoder(**{self.input_name: inputs}).last_hidden_state[0]   # [S, D]
        parts = []
        for projections, (heads, head_dim) in zip(self.projections, self.shapes):
            for projection in projections:
                rows = projection(states)                                      # [S, H * Dh]
                parts.append(rows.view(rows.shape[0], heads, head_dim).transpose(0, 1))
        return torch.cat(parts, 0)                                             # [H, S, Dh] each


class _GivenLayer:
    """A cross-attention cache layer holding keys and values computed elsewhere: transformers'
    attention reads ``.keys`` / ``.values`` of a layer its cache marks as updated."""

    is_initialized, is_sliding, is_compileable = True, False, True

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def get_seq_length(self):
        return self.keys.shape[-2]


class DecoderStep(nn.Module):
    """One decoder step: ``(input_ids (1, 1), packed cross keys/values, cache_position (1,))``
    -> logits, through the model's ``forward`` with the self-attention cache in this module's
    buffers (transformers' ``StaticCache``) and the cross-attention cache given."""

    def __init__(self, model, max_cache: int):
        super().__init__()
        from transformers.cache_utils import StaticCache

        self.model = model
        self.attentions = cross_attentions(model)
        config = copy.deepcopy(model.config.get_text_config(decoder=True))
        config.num_hidden_layers = len(self.attentions)   # Whisper's counts the encoder's
        self.cache = StaticCache(config=config, max_cache_len=max_cache)
        _, _, heads, head_dim = self.attentions[0]
        self.cache.early_initialization(1, heads, head_dim, torch.float32,
                                        next(model.parameters()).device)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length,
                                 persistent=False)

    def forward(self, input_ids, cross_kv, cache_position):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        for layer in self.cache.layers:          # the step's position, as transformers' own
            layer.cumulative_length.copy_(cache_position[0])     # exportable wrappers set it
        given, row = [], 0
        for _, _, heads, head_dim in self.attentions:
            # a view of one dynamic size, which XNNPACK takes (the pass's dynamic_views step);
            # an unsqueeze of a text model's keys (their source length dynamic) is a copy on
            # portable kernels, 0.13 ms a step at t5-small's dims over 128 source tokens
            given.append(_GivenLayer(cross_kv[row:row + heads].view(1, heads, -1, head_dim),
                                     cross_kv[row + heads:row + 2 * heads].view(
                                         1, heads, -1, head_dim)))
            row += 2 * heads
        cross = DynamicCache()
        cross.layers = given
        cache = EncoderDecoderCache(self.cache, cross)     # marks every cross layer updated
        # the encoder's states are never read (each cross-attention reads the cache); the model
        # takes their shape [1, S, D] for its encoder mask, absent here (nothing padded)
        _, _, heads, head_dim = self.attentions[0]
        states = cross_kv[:1, :, :1].expand(1, -1, heads * head_dim)
        return self.model(decoder_input_ids=input_ids, encoder_outputs=(states,), cache=cache,
                          use_cache=True).logits


@dataclass
class Seq2SeqPrograms:
    """The two exported programs and the constant methods to emit with them."""

    programs: dict                       # {"encoder": ExportedProgram, "text_decoder": ...}
    metadata: dict = field(default_factory=dict)
    max_cache: int = 0
    speech: bool = False


def is_speech(model) -> bool:
    return getattr(model.config, "num_mel_bins", None) is not None


def target_positions(model) -> int:
    """The decoder's own limit on positions (Whisper: 448; T5, whose positions are relative:
    :data:`.t5.RELATIVE_POSITIONS`)."""
    config = model.config
    for name in ("max_target_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    if t5.positions(config) is not None:
        return t5.positions(config)
    raise ValueError(f"{type(model).__name__}: its config names no decoder positions")


def _metadata(model, max_cache: int, layers: int) -> dict:
    """What a runner reads, under the names executorch's runners and optimum-executorch use."""
    config, generation = model.config, getattr(model, "generation_config", None)
    metadata = {"get_max_seq_len": max_cache, "get_vocab_size": int(config.vocab_size),
                "get_n_layers": layers, "use_kv_cache": True, "get_max_batch_size": 1}
    for source in (generation, config):
        # generate's start token: decoder_start_token_id, else bos_token_id (mBART's configs)
        for name in ("decoder_start_token_id", "bos_token_id"):
            start = getattr(source, name, None)
            if isinstance(start, int):
                metadata.setdefault("decoder_start_token_id", start)
                break
        eos = getattr(source, "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else eos
        if eos and all(isinstance(e, int) for e in eos):
            metadata.setdefault("get_eos_ids", list(eos))
    return metadata


def export_seq2seq(model, max_cache: Optional[int] = None, example_source: int = 8
                   ) -> Seq2SeqPrograms:
    """``encoder`` and ``text_decoder`` of a transformers encoder-decoder model in eval mode
    (its weights shared, not copied; the model is not changed). ``max_cache``: the decoder's
    cache rows, at most (and by default) its positions."""
    positions = target_positions(model)
    max_cache = positions if max_cache is None else max_cache
    if not 1 <= max_cache <= positions:
        raise ValueError(f"max_cache {max_cache}: 1 to the decoder's {positions} positions")
    attentions = cross_attentions(model)
    config, speech = model.config, is_speech(model)
    with torch.no_grad():
        if speech:                 # one fixed window of log-mel frames
            name, dims = "input_features", None
            example = torch.zeros(1, config.num_mel_bins, 2 * config.max_source_positions)
        else:                      # 1 .. max_position_embeddings source tokens
            name = "input_ids"
            most = getattr(config, "max_position_embeddings", None) or t5.positions(config)
            dims = {1: torch.export.Dim("source_tokens", min=1, max=most)}
            example = torch.ones(1, min(example_source, most), dtype=torch.long)
        encoder = EncoderWithCrossKV(model, name).eval()
        encoder_program = export_with_fake_weights(encoder, (example,),
                                                   dynamic_shapes=(dims,), strict=True)
        decoder_program = export_with_fake_weights(
            DecoderStep(model, max_cache).eval(),
            (torch.zeros(1, 1, dtype=torch.long), encoder(example),
             torch.zeros(1, dtype=torch.long)),
            dynamic_shapes=(None, dims, None), strict=True)
    return Seq2SeqPrograms({ENCODER: encoder_program, DECODER: decoder_program},
                           _metadata(model, max_cache, len(attentions)), max_cache, speech)
