"""The partitioner's side of run-time weights: a GEMM config that takes a marked fp32 GEMM's
weight and bias as run-time inputs of the delegate (``force_non_static_weights_for_f32_linear``
for that GEMM only), opened per partitioner instance. The marking is the step's
(:mod:`xnnfold.steps.runtime_weight`)."""

from __future__ import annotations

import functools

import torch.fx
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

MARK = "xnnfold_runtime_weight"
_WRAPPED_TARGETS = ("linear.default", "addmm.default", "mm.default")


def is_marked(node: torch.fx.Node) -> bool:
    return bool(node.meta.get("custom", {}).get(MARK))


@functools.cache
def runtime_weight_config(base: type) -> type:
    """``base`` (a GEMM config class) taking a marked fp32 GEMM's weight and bias at run time,
    as ``force_non_static_weights_for_f32_linear`` does for all of them."""

    class RuntimeWeight(base):
        def _get_weight_deps(self, node, ep, precision):
            if precision == ConfigPrecisionType.FP32 and is_marked(node):
                return True, []
            return super()._get_weight_deps(node, ep, precision)

        def _get_bias_deps(self, node, ep, precision):
            if precision == ConfigPrecisionType.FP32 and is_marked(node):
                return True, []
            return super()._get_bias_deps(node, ep, precision)

    RuntimeWeight.__name__ = RuntimeWeight.__qualname__ = f"RuntimeWeight{base.__name__}"
    return RuntimeWeight


def open_runtime_weight_path(partitioner) -> None:
    """Wrap ``partitioner``'s own linear/addmm/mm configs (this instance only)."""
    configs = getattr(partitioner, "target_partitioner_configs", {})
    for target in _WRAPPED_TARGETS:
        config = configs.get(target)
        if config is not None:
            config.__class__ = runtime_weight_config(type(config))
