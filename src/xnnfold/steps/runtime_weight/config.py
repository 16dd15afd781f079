"""The partitioner's side of run-time weights: a GEMM config that takes a marked fp32 GEMM's
weight and bias as run-time inputs of the delegate (``force_non_static_weights_for_f32_linear``
for that GEMM only), built per partitioner instance from its own configs
(:mod:`xnnfold.steps.configs`) when it asks the step what it opens. The marking is the step's
(:mod:`xnnfold.steps.runtime_weight`)."""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch.fx
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

from ...errors import warn_or_raise
from ..configs import extend_configs

logger = logging.getLogger("xnnfold")

MARK = "xnnfold_runtime_weight"
_WRAPPED_TARGETS = ("linear.default", "addmm.default", "mm.default")
_OVERRIDDEN = ("_get_weight_deps", "_get_bias_deps")


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


def missing_internals(partitioner) -> list:
    """What of executorch 1.5.1's partitioner this relies on is not there (an executorch that
    renamed it): its per-target configs, a config for each GEMM target, and the two methods
    the wrapper overrides."""
    configs = getattr(partitioner, "target_partitioner_configs", None)
    if not isinstance(configs, dict):
        return ["XnnpackPartitioner.target_partitioner_configs"]
    missing = []
    for target in _WRAPPED_TARGETS:
        config = configs.get(target)
        if config is None:
            missing.append(f"a partitioner config for {target}")
            continue
        missing += [f"{type(config).__name__}.{method}" for method in _OVERRIDDEN
                    if not callable(getattr(config, method, None))]
    return missing


def runtime_weight_configs(partitioner) -> Optional[dict]:
    """``partitioner``'s linear/addmm/mm configs extended to take a marked GEMM's weight at run
    time (new instances, by target name); None, with a warning (strict mode: an error), when
    executorch's internals are not what this extends."""
    missing = missing_internals(partitioner)
    if missing:
        warn_or_raise(logger, "xnnfold: run-time weights are off: executorch's partitioner "
                      "has no %s (a GEMM marked for a run-time weight stays where stock "
                      "leaves it)", ", ".join(missing))
        return None
    return extend_configs(partitioner, _WRAPPED_TARGETS, runtime_weight_config)
