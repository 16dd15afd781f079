"""Decoder-only LMs with a static KV cache, built from configs with random weights, the two ways
users export them for ExecuTorch:

- :func:`transformers_lm` — a transformers causal LM wrapped by
  ``transformers.integrations.executorch.TorchExportableModuleForDecoderOnlyLM`` (static cache,
  ``cache_implementation="static"``), exported with ``torch.export`` as that wrapper does;
- :func:`executorch_llama` — executorch's own Llama (``executorch.examples.models.llama``), with
  its plain KV cache and SDPA, or (``custom=True``) with the custom KV cache and
  ``llama::custom_sdpa`` / ``llama::update_cache`` its LLM flow (``export_llama``) uses.

Each returns a :class:`DecoderLM`: the eager module, how to call it for one step, and how to
export one step (``tokens`` tokens at a given position). The sizes default to the issue's:
hidden 512, 4 layers, 8 heads, 2 KV heads, vocabulary 32,000, cache 1,024; the MLP's width is
executorch's (``4 * hidden * 2 / 3`` rounded up to 256), on both roads.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch

ARCHITECTURES = ("llama", "qwen2", "phi3", "gemma", "smollm", "gemma2", "bloom", "opt", "mpt",
                 "falcon-alibi")


@dataclass(frozen=True)
class Dims:
    hidden: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 32_000
    cache: int = 1024

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp(self) -> int:
        """executorch's Llama FFN width: 2/3 of 4 x hidden, rounded up to a multiple of 256."""
        return 256 * math.ceil(int(2 * 4 * self.hidden / 3) / 256)

    @staticmethod
    def for_hidden(hidden: int, cache: int = 1024, layers: int = 4, vocab: int = 32_000) -> "Dims":
        """Head size 64, a KV head per four query heads (the issue's 512 / 8 / 2, scaled)."""
        heads = max(1, hidden // 64)
        return Dims(hidden, layers, heads, max(1, heads // 4), vocab, cache)


@dataclass
class DecoderLM:
    """An eager decoder LM with a KV cache and how to export and feed one step of it."""

    name: str
    module: torch.nn.Module            # stateful: its cache buffers hold the eager run's state
    dims: Dims
    # (tokens [1, L] int64, start position) -> the step's inputs, as the .pte takes them
    step_inputs: Callable[[torch.Tensor, int], tuple]
    # the step's inputs -> eager logits (mutates the module's cache, as the .pte does its own)
    run: Callable[[tuple], torch.Tensor]
    # (tokens in the step, position) -> ExportedProgram of one step
    export: Callable[..., torch.export.ExportedProgram]
    # a fresh module with empty caches (for an eager reference run from the start)
    fresh: Callable[[], "DecoderLM"]
    strict_edge: bool = True           # False: to_edge needs _check_ir_validity=False (llama::)
    # (module, the step's inputs) -> (args, kwargs) its forward takes
    call_args: Callable[[tuple], tuple] = None


def _hf_config(arch: str, dims: Dims, **extra):
    import transformers

    if arch in _OWN_NAMES:
        return _own_names_config(arch, dims)
    common = dict(hidden_size=dims.hidden, num_hidden_layers=dims.layers,
                  num_attention_heads=dims.heads, num_key_value_heads=dims.kv_heads,
                  vocab_size=dims.vocab, intermediate_size=dims.mlp,
                  max_position_embeddings=max(4096, 2 * dims.cache), **extra)
    if arch in ("llama", "smollm"):
        return transformers.LlamaConfig(**common, tie_word_embeddings=arch == "smollm")
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=True)
    if arch == "phi3":
        return transformers.Phi3Config(**common, pad_token_id=0)
    if arch == "gemma":
        # exact GELU: XNNPACK 1.5.1 delegates gelu(approximate="tanh"), Gemma's own, as the
        # exact one (5e-4 off eager in stock's .pte too)
        return transformers.GemmaConfig(**common, head_dim=dims.head_dim,
                                        hidden_activation="gelu")
    if arch == "gemma2":
        # eager attention (transformers has no SDPA for it: soft-capping), a sliding window of
        # a quarter of the cache on every other layer, soft-capped scores and logits
        return transformers.Gemma2Config(**common, head_dim=dims.head_dim,
                                         hidden_activation="gelu",
                                         sliding_window=max(2, dims.cache // 4),
                                         query_pre_attn_scalar=dims.head_dim,
                                         attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")


# Families whose configs name their sizes their own way; ALiBi and learned positions, one KV
# head per query head
_OWN_NAMES = ("bloom", "opt", "mpt", "falcon-alibi")


def _own_names_config(arch: str, dims: Dims):
    import transformers

    if arch == "bloom":
        return transformers.BloomConfig(hidden_size=dims.hidden, n_layer=dims.layers,
                                        n_head=dims.heads, vocab_size=dims.vocab)
    if arch == "opt":
        return transformers.OPTConfig(hidden_size=dims.hidden, num_hidden_layers=dims.layers,
                                      num_attention_heads=dims.heads, vocab_size=dims.vocab,
                                      ffn_dim=dims.mlp, word_embed_proj_dim=dims.hidden,
                                      max_position_embeddings=max(2048, 2 * dims.cache))
    if arch == "mpt":
        return transformers.MptConfig(d_model=dims.hidden, n_layers=dims.layers,
                                      n_heads=dims.heads, vocab_size=dims.vocab,
                                      expansion_ratio=2, max_seq_len=max(2048, 2 * dims.cache))
    return transformers.FalconConfig(hidden_size=dims.hidden, num_hidden_layers=dims.layers,
                                     num_attention_heads=dims.heads, vocab_size=dims.vocab,
                                     alibi=True, new_decoder_architecture=False,
                                     multi_query=False, parallel_attn=True,
                                     max_position_embeddings=max(2048, 2 * dims.cache))


def causal_lm(arch: str, dims: Dims, seed: int = 0):
    """transformers' causal LM of ``arch`` (see :data:`ARCHITECTURES`) at ``dims``, random
    weights from ``seed``, in eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = _hf_config(arch, dims)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # random weights drawn from a wider distribution than the init's, so logits move
    for name, param in model.named_parameters():
        if "norm" in name and param.dim() == 1:
            torch.nn.init.uniform_(param, 0.5, 1.5)
        elif "bias" in name:
            torch.nn.init.normal_(param, std=0.1)
        elif arch in ("gemma2",) + _OWN_NAMES and param.dim() == 2:
            # their init (std 0.02) leaves every logit near 0: greedy decoding repeats one
            # token, and a run that repeats one token checks little
            torch.nn.init.normal_(param, std=param.shape[1] ** -0.5)
    return model


# int8 and 8da4w: what ``xnnfold hf --quantize`` ships (torchao on the eager model,
# :mod:`xnnfold.export.llm.quantize`); pt2e-int8: the XNNPACK PT2E quantizer's dynamic
# per-channel int8 on the exported step (the same XNNPACK kernel as int8; what this bench
# measured as int8 before the generation .pte had a quantization of its own)
QUANTIZATIONS = ("none", "int8", "8da4w", "pt2e-int8")
PT2E_INT8 = "pt2e-int8"


def _quantized(model: torch.nn.Module, quant: str) -> None:
    from ..export.llm.quantize import quantize_linears

    if quant in ("int8", "8da4w"):
        quantize_linears(model, quant)


def pt2e_dynamic_int8(lm: DecoderLM) -> DecoderLM:
    """``lm`` quantized by the XNNPACK PT2E quantizer, dynamic per-channel int8 linears: its
    exported step prepared, run once, converted; the converted module is the eager reference
    and what is exported."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(
        is_per_channel=True, is_dynamic=True))
    example = lm.step_inputs(torch.zeros(1, 1, dtype=torch.long), 0)
    with torch.no_grad():
        prepared = prepare_pt2e(lm.export().module(), quantizer)
        args, kwargs = lm.call_args(example)
        prepared(*args, **kwargs)
        converted = convert_pt2e(prepared)
    pristine = copy.deepcopy(converted)

    def run(inputs: tuple) -> torch.Tensor:
        args, kwargs = lm.call_args(inputs)
        with torch.no_grad():
            return converted(*args, **kwargs)

    def export(tokens: int = 1, position: int = 0, dynamic: bool = False):
        args, kwargs = lm.call_args(lm.step_inputs(torch.zeros(1, tokens, dtype=torch.long),
                                                   position))
        with torch.no_grad():
            return torch.export.export(copy.deepcopy(pristine), args, kwargs, strict=False)

    return DecoderLM(f"{lm.name}-{PT2E_INT8}", converted, lm.dims, lm.step_inputs, run, export,
                     lambda: pt2e_dynamic_int8(lm.fresh()), lm.strict_edge, lm.call_args)


def transformers_lm(arch: str = "llama", dims: Dims = Dims(), seed: int = 0,
                    last_logits: bool = False, quant: str = "none") -> DecoderLM:
    """transformers' ``arch`` (see :data:`ARCHITECTURES`) through its ExecuTorch wrapper:
    inputs ``(input_ids [1, L], cache_position [L])``, output the logits ``[1, L, vocab]``
    (``last_logits``: ``[1, 1, vocab]``, the wrapper's forward with ``logits_to_keep=1``, what
    a prefill for generation needs). ``quant``: see :data:`QUANTIZATIONS`."""
    from ..export.static_cache import with_static_cache

    if quant == PT2E_INT8:
        return pt2e_dynamic_int8(transformers_lm(arch, dims, seed, last_logits))
    model = causal_lm(arch, dims, seed)
    _quantized(model, quant)
    inner = with_static_cache(model, dims.cache, last_logits)    # holds the cache buffers
    pristine = copy.deepcopy(inner)

    def step_inputs(tokens: torch.Tensor, position: int) -> tuple:
        return tokens, torch.arange(position, position + tokens.shape[1])

    def run(inputs: tuple) -> torch.Tensor:
        with torch.no_grad():
            return inner(input_ids=inputs[0], cache_position=inputs[1])

    def export(tokens: int = 1, position: int = 0, dynamic: int = 0):
        """One step of ``tokens`` tokens; ``dynamic``: of 1 to that many (True: the cache's
        rows less one), as a generation program's one method takes them."""
        ids, cache_position = step_inputs(torch.zeros(1, tokens, dtype=torch.long), position)
        shapes = None
        if dynamic:
            longest = dims.cache - 1 if dynamic is True else dynamic
            length = torch.export.Dim("length", min=1, max=longest)
            shapes = {"input_ids": {1: length}, "cache_position": {0: length}}
        with torch.no_grad():
            return torch.export.export(copy.deepcopy(pristine), args=(),
                                       kwargs={"input_ids": ids, "cache_position": cache_position},
                                       dynamic_shapes=shapes, strict=True)

    def fresh() -> DecoderLM:
        return transformers_lm(arch, dims, seed, last_logits, quant)

    def call_args(inputs: tuple) -> tuple:
        return (), {"input_ids": inputs[0], "cache_position": inputs[1]}

    name = f"transformers-{arch}" + ("-last-logits" if last_logits else "") + \
        ("" if quant == "none" else f"-{quant}")
    return DecoderLM(name, inner, dims, step_inputs, run, export, fresh, call_args=call_args)


def executorch_llama(dims: Dims = Dims(), custom: bool = False, seed: int = 0,
                     quant: str = "none") -> DecoderLM:
    """executorch's example Llama with a KV cache; ``custom``: its LLM flow's custom KV cache
    and SDPA ops. Inputs ``(tokens [1, L], input_pos [L])``; output the last token's logits.
    ``quant``: see :data:`QUANTIZATIONS`."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    if quant == PT2E_INT8:
        return pt2e_dynamic_int8(executorch_llama(dims, custom, seed))

    torch.manual_seed(seed)
    args = ModelArgs(dim=dims.hidden, n_layers=dims.layers, n_heads=dims.heads,
                     n_kv_heads=dims.kv_heads, vocab_size=dims.vocab, hidden_dim=dims.mlp,
                     head_dim=dims.head_dim, max_seq_len=dims.cache,
                     max_context_len=dims.cache, use_kv_cache=True,
                     use_sdpa_with_kv_cache_op=custom, enable_dynamic_shape=False)
    module = construct_transformer(args).eval()
    for name, param in module.named_parameters():
        if "norm" in name:
            torch.nn.init.uniform_(param, 0.5, 1.5)
        else:
            torch.nn.init.normal_(param, std=0.02)
    if custom:
        from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
            replace_kv_cache_with_custom_kv_cache,
        )
        from executorch.examples.models.llama.source_transformation.sdpa import (
            replace_sdpa_with_custom_op,
        )
        replace_kv_cache_with_custom_kv_cache(module)
        replace_sdpa_with_custom_op(module)
    _quantized(module, quant)
    pristine = copy.deepcopy(module)

    def step_inputs(tokens: torch.Tensor, position: int) -> tuple:
        # static shapes: every position of the step (the custom ops read the first)
        return tokens, torch.arange(position, position + tokens.shape[1])

    def run(inputs: tuple) -> torch.Tensor:
        with torch.no_grad():
            return module(inputs[0], {"input_pos": inputs[1]})

    def export(tokens: int = 1, position: int = 0, dynamic: bool = False):
        if dynamic:
            raise ValueError("executorch's example Llama is exported here with static shapes")
        example = step_inputs(torch.zeros(1, tokens, dtype=torch.long), position)
        with torch.no_grad():
            return torch.export.export(copy.deepcopy(pristine),
                                       (example[0], {"input_pos": example[1]}), strict=False)

    def fresh() -> DecoderLM:
        return executorch_llama(dims, custom, seed, quant)

    def call_args(inputs: tuple) -> tuple:
        return (inputs[0], {"input_pos": inputs[1]}), {}

    name = ("executorch-llama-custom" if custom else "executorch-llama") + \
        ("" if quant == "none" else f"-{quant}")
    return DecoderLM(name, module, dims, step_inputs, run, export, fresh, strict_edge=not custom,
                     call_args=call_args)


# bytes a quantized linear reads per weight: int8 per channel (a scale per row, negligible),
# int4 in groups of 32 with a bf16 scale each (XNNPACK's blockwise layout: the 8da4w .pte of
# llm-decode's Llama is 81.7 MB, 65.5 of them the fp32 embedding)
WEIGHT_BYTES = {"none": 4.0, "int8": 1.0, "8da4w": 0.5 + 2 / 32, "pt2e-int8": 1.0}


def weight_bytes_read(dims: Dims, tied: bool = False, quant: str = "none") -> int:
    """Bytes of the weights one decode step reads: every layer's projections and MLP and the
    output head (``quant``: as stored), the norms, and one fp32 row of the embedding table (a
    tied head reads the table once, as the head)."""
    d, kv = dims.hidden, dims.kv_heads * dims.head_dim
    linears = dims.layers * (d * d * 2 + d * kv * 2 + 3 * d * dims.mlp) + dims.vocab * d
    return int(WEIGHT_BYTES[quant] * linears) + 4 * (dims.layers * 2 * d + d +
                                                      (0 if tied else d))


def cache_bytes_read(dims: Dims, rows: int) -> int:
    """fp32 bytes of K and V an attention over ``rows`` cache rows reads, all layers."""
    return 4 * dims.layers * 2 * dims.kv_heads * dims.head_dim * rows
