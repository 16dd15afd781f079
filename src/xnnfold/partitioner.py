"""The drop-in partitioner, and ``fold_gemm_params`` for every other path.

``to_edge_transform_and_lower`` calls ``transform_for_pre_decomposition`` on each partitioner
before decomposing the program, with real param data: the one place, in executorch 1.5.1, where
a partitioner may change the program it is about to partition. ``partition()`` itself sees fake
params and must leave the graph as it is.
"""

from __future__ import annotations

from typing import Optional

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from torch.export import ExportedProgram

from . import pipeline
from .probe import delegated_placeholders
from .rules import DEFAULT_RULES, RuleSet
from .runtime_weight import open_runtime_weight_path


def _check_program(ep) -> None:
    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"xnnfold expects a torch.export.ExportedProgram, got {type(ep).__name__}; "
            "export the module first: torch.export.export(module, example_inputs)")


def fold_gemm_params(ep: ExportedProgram,
                     partitioner: Optional[StockXnnpackPartitioner] = None,
                     rules: RuleSet = DEFAULT_RULES) -> pipeline.FoldResult:
    """Fold the computed weights and biases of ``ep``'s GEMMs into constants.

    Returns a :class:`~xnnfold.pipeline.FoldResult`: ``.program`` is a new ExportedProgram
    (``ep`` is not modified) to lower with ``to_edge`` + ``to_backend`` or any other path, and
    ``.operands`` says, for every GEMM weight and bias, whether it was plain, folded or declined
    and why. ``partitioner`` is the XNNPACK partitioner whose verdict the *delegated* rule asks
    (default: a stock ``XnnpackPartitioner()``); it is not changed. ``rules`` is the
    :class:`~xnnfold.rules.RuleSet` to apply (tests pass one without a rule).
    """
    _check_program(ep)
    partitioner = partitioner if partitioner is not None else StockXnnpackPartitioner()
    return pipeline.run(ep, lambda program: delegated_placeholders(program, partitioner), rules)


class XnnpackPartitioner(StockXnnpackPartitioner):
    """``executorch``'s XnnpackPartitioner, folding computed GEMM weights and biases first.

    Same constructor. Use it with ``to_edge_transform_and_lower``; after a lowering,
    ``last_result`` holds the :class:`~xnnfold.pipeline.FoldResult` of the last program.
    Its linear configs also take the GEMMs the fold marks (a weight that cannot be a
    constant) with their weight as a run-time input; see :mod:`xnnfold.runtime_weight`.
    """

    def __init__(self, *args, rules: RuleSet = DEFAULT_RULES, **kwargs):
        super().__init__(*args, **kwargs)
        open_runtime_weight_path(self)
        self.rules = rules
        self.last_result: Optional[pipeline.FoldResult] = None

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram
                                        ) -> ExportedProgram:
        self.last_result = fold_gemm_params(exported_program, self, self.rules)
        return self.last_result.program
