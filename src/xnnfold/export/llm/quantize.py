"""The weight quantizations people ship LLMs with on XNNPACK, applied to a causal LM's linears
before its export (``xnnfold hf --quantize``, the LLM bench's ``--quant``):

- ``8da4w``: 8-bit dynamic activations, 4-bit weights in groups of ``group_size`` (32 by
  default) — optimum-executorch's ``--qlinear 8da4w`` (its default group size 32 and its
  default choice of the scales, ``hqq_scale_only``), executorch's ``--qmode 8da4w``;
- ``int8``: 8-bit dynamic activations, 8-bit weights per output channel (optimum's ``--qlinear
  8da8w``): XNNPACK's dynamically quantized int8 linear, the kernel of the XNNPACK PT2E
  quantizer's dynamic per-channel configuration.

Both as torchao's ``quantize_`` quantizes the eager model
(``Int8DynamicActivationIntxWeightConfig``), the same weights bit for bit, with its scale
search run a block of rows at a time (:mod:`~xnnfold.export.llm.scale_search`): the quantized
eager model is then the reference a .pte's tokens are compared with. The PT2E
road (``prepare_pt2e`` / ``convert_pt2e`` on the exported program) is not used for the
generation .pte: on its dynamic-length ``forward`` the XNNPACK partitioner of executorch 1.5.1,
stock and xnnfold alike, fails with "Invalid partition, found dependency cycles" (a rotary
``mul`` and a later ``permute`` tagged into one partition across another delegate).
torchao is imported when a quantization is applied, never by importing this module.
"""

from __future__ import annotations

import copy
import functools
import types

import torch
from torch import nn

INT8, W4 = "int8", "8da4w"
SCHEMES = (W4, INT8)
DEFAULT_GROUP_SIZE = 32
# optimum-executorch's default choice of the quantization scales (quantization.py,
# DEFAULT_QPARAMS_ALGORITHM): half-quadratic optimisation of the scales alone
SCALES = "hqq_scale_only"


def describe(scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> str:
    if scheme == W4:
        return (f"8-bit dynamic activations, 4-bit weights in groups of {group_size} "
                f"(torchao, {SCALES} scales)")
    return f"8-bit dynamic activations, 8-bit weights per channel (torchao, {SCALES} scales)"


def linear_quantization(scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> tuple:
    """(torchao's config of ``scheme``, which modules it quantizes: a function of a module):
    with ``8da4w``, the ``nn.Linear`` layers whose input size ``group_size`` divides (the
    others stay fp32, as optimum leaves them), with ``int8`` every one. ``ValueError`` (one
    line) for an unknown scheme or group size."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    if scheme not in SCHEMES:
        raise ValueError(f"quantization {scheme!r}: expected one of {', '.join(SCHEMES)}")
    if scheme == W4:
        if group_size < 2 or group_size % 2:
            raise ValueError(f"group size {group_size}: an even number of at least 2")
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(group_size),
            intx_choose_qparams_algorithm=SCALES)
        return config, lambda module: (isinstance(module, nn.Linear) and
                                       module.in_features % group_size == 0)
    config = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0),
        intx_choose_qparams_algorithm=SCALES)
    return config, lambda module: isinstance(module, nn.Linear)


def quantize_linears(model: nn.Module, scheme: str, group_size: int = DEFAULT_GROUP_SIZE
                     ) -> int:
    """Quantize ``model``'s linears in place with ``scheme`` (:data:`SCHEMES`, the linears
    :func:`linear_quantization` takes), as torchao's ``quantize_`` does. Returns how many
    linears were quantized; ``ValueError`` (one line) for an unknown scheme or a model with no
    linear to quantize."""
    config, takes = linear_quantization(scheme, group_size)
    linears = [m for m in model.modules() if takes(m)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear that {scheme} quantizes"
                         + (f" (none has an input size divisible by {group_size})"
                            if scheme == W4 else ""))
    for linear in linears:
        quantize_linear(linear, config)
    return len(linears)


def quantize_linear(linear: nn.Linear, config) -> None:
    """``linear``'s weight replaced by its quantization with ``config`` (torchao's
    ``Int8DynamicActivationIntxWeightConfig``), the module as torchao's ``quantize_`` leaves it:
    the same tensor subclass, fields and values, bit for bit, with the scales searched by
    :func:`~xnnfold.export.llm.scale_search.hqq_scale_only` (torchao's search a block of rows
    at a time: 3,072 x 3,072 in about a tenth of the time). A config this does not build is
    handed to ``quantize_`` itself."""
    weight = _quantized_weight(linear.weight.data, config)
    if weight is None:
        from torchao.quantization import quantize_

        quantize_(linear, config)
        return
    from torchao.quantization.utils import _module_extra_repr

    linear.weight = nn.Parameter(weight, requires_grad=False)
    linear.extra_repr = types.MethodType(functools.partial(
        _module_extra_repr, original_extra_repr=linear.extra_repr, parameter_name="weight"),
        linear)


def _quantized_weight(weight: torch.Tensor, config):
    """torchao's ``IntxUnpackedToInt8Tensor`` of ``weight`` as its handler of ``config`` builds
    it (``from_hp`` with the ``hqq_scale_only`` search, then no other step), or None when
    ``config`` asks for something else (another search, a packed format, scales of another
    type) or ``weight`` is not a plain float matrix."""
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import _DTYPE_TO_QVALUE_BOUNDS, MappingType
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
        IntxUnpackedToInt8Tensor)

    from .scale_search import hqq_scale_only

    granularity = config.weight_granularity
    if (config.intx_choose_qparams_algorithm != SCALES or config.version != 2
            or config.intx_packing_format != "unpacked_to_int8"
            or config.act_mapping_type != MappingType.ASYMMETRIC
            or config.weight_scale_dtype not in (None, weight.dtype)
            or type(weight) is not torch.Tensor or weight.ndim != 2
            or weight.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or not isinstance(granularity, (PerGroup, PerAxis))):
        return None
    group_size = (granularity.group_size if isinstance(granularity, PerGroup)
                  else weight.shape[-1])
    if weight.shape[-1] % group_size:
        return None
    qmin, qmax = _DTYPE_TO_QVALUE_BOUNDS[config.weight_dtype]
    qdata, scale = hqq_scale_only(weight, group_size, qmin, qmax)
    return IntxUnpackedToInt8Tensor(
        qdata=qdata, scale=scale, zero_point=torch.zeros_like(scale, dtype=torch.int8),
        target_dtype=config.weight_dtype, block_size=(1, group_size), dtype=weight.dtype,
        activation_quantization="int8_asym_per_token")


def quantized_linears(model: nn.Module) -> list:
    """The linears of ``model`` whose weight is quantized (a tensor subclass of torchao's, not
    a plain tensor)."""
    return [m for m in model.modules()
            if isinstance(m, nn.Linear) and type(m.weight.data) is not torch.Tensor]


def is_quantized(model: nn.Module) -> bool:
    """Whether some linear of ``model`` has a quantized weight (:func:`quantized_linears`)."""
    return bool(quantized_linears(model))


def quantized_copy(model: nn.Module, scheme: str) -> nn.Module:
    """A copy of ``model`` with its linears quantized by ``scheme`` (:func:`quantize_linears`);
    the caller's model stays as it is. The copy's modules are new, its tensors the caller's:
    the quantization sets each quantized linear's weight anew (it never writes the fp32 one),
    so the caller's model is unchanged, and the weights are never held twice (a deep copy was
    a second fp32 copy of the whole model at its peak)."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    copied = copy.deepcopy(model, memo=shared)
    quantize_linears(copied, scheme)
    return copied
