"""The partitioner's side of the visible rows (:mod:`.visible`): XNNPACK's configs for the
attention's ops, taking a node the step marked whose sizes include the run-time row count.

executorch 1.5.1's configs decline every node with an unbacked size ("XNNPACK does not support
empty tensors. But we can't get numel() for unbacked symints"): the attention over the visible
rows would then stay on portable, its two ``bmm`` as naive loops. A marked node's unbacked
sizes are ``P + L`` (``P >= 0``, ``L >= 1``): the config checks that each is at least 1 from
the symbols' ranges and that its tensors are fp32 (the KV-cache step marks fp32 attentions
only); everything else (the op's own constraints) is the stock config's. XNNPACK's runtime
takes the sizes of a delegate's inputs at each call (as for a dynamic length), so the .pte runs
on the stock runtime.

The KV-cache step's opening (:func:`open_visible_rows`, the step protocol's ``open``): configs
built per partitioner instance from its own (:mod:`xnnfold.steps.configs`), as the run-time
weights' are (:mod:`xnnfold.steps.runtime_weight.config`), with the step that emits the
visible rows; where executorch's internals are not what this extends, the step that reads
every cache row, as before.
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch
import torch.fx
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ...graph.values import at_least_one
from ..configs import extend_configs
from ..protocol import Opening

logger = logging.getLogger("xnnfold")

MARK = "xnnfold_visible_rows"
# the ops of the attention over the visible rows, as the edge dialect names them
_WRAPPED_TARGETS = ("bmm.default", "_softmax.default", "add.Tensor", "permute_copy.default")
_OVERRIDDEN = "_check_node_has_valid_dtype"


def mark(node: torch.fx.Node) -> None:
    node.meta.setdefault("custom", {})[MARK] = True


def is_marked(node: torch.fx.Node) -> bool:
    return bool(node.meta.get("custom", {}).get(MARK))


def tensors_of(node: torch.fx.Node) -> list:
    """The tensors ``node`` reads and makes (their fake values)."""
    values = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return [v for v in values if isinstance(v, torch.Tensor)]


def takes_marked(node: torch.fx.Node) -> bool:
    """A marked node XNNPACK takes: fp32 tensors, every size at least 1 (an unbacked one by
    its range)."""
    tensors = tensors_of(node)
    return bool(tensors) and all(
        t.dtype == torch.float32 and all(at_least_one(d) for d in t.shape) for t in tensors)


@functools.cache
def visible_rows_config(base: type) -> type:
    """``base`` (an XNNPACK config class) also taking a marked node with unbacked sizes."""

    class VisibleRows(base):
        def _check_node_has_valid_dtype(self, node):
            if is_marked(node) and any(free_unbacked_symbols(t) for t in tensors_of(node)):
                return takes_marked(node)
            return super()._check_node_has_valid_dtype(node)

    VisibleRows.__name__ = VisibleRows.__qualname__ = f"VisibleRows{base.__name__}"
    return VisibleRows


def visible_rows_configs(partitioner) -> Optional[dict]:
    """``partitioner``'s configs of the attention's ops extended to take the marked nodes (new
    instances, by target name); None when executorch's internals are not what this extends,
    or the partitioner takes no fp32 (the step then reads every row)."""
    configs = getattr(partitioner, "target_partitioner_configs", None)
    if not isinstance(configs, dict) or not all(
            callable(getattr(configs.get(t), _OVERRIDDEN, None)) for t in _WRAPPED_TARGETS):
        logger.info("xnnfold: the attention reads every cache row: executorch's partitioner "
                    "has no %s config with %s", "/".join(_WRAPPED_TARGETS), _OVERRIDDEN)
        return None
    # a partitioner for other precisions (config_precisions=DYNAMIC_QUANT) takes no fp32 bmm:
    # the attention over the visible rows would stay on portable
    if not all(ConfigPrecisionType.FP32 in getattr(configs[t], "enabled_precision_types", ())
               for t in _WRAPPED_TARGETS):
        return None
    return extend_configs(partitioner, _WRAPPED_TARGETS, visible_rows_config)


def open_visible_rows(partitioner, visible_rows_step, every_row_step) -> Opening:
    """The KV-cache step's opening for ``partitioner``: ``visible_rows_step`` with the configs
    that take what it emits, or ``every_row_step`` where they cannot be built."""
    configs = visible_rows_configs(partitioner)
    if configs is None:
        return Opening(every_row_step)
    return Opening(visible_rows_step, configs)
