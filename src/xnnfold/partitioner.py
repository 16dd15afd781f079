"""The fold as a pass, the drop-in partitioner that runs it, and ``fold_gemm_params``.

``to_edge_transform_and_lower`` calls ``transform_for_pre_decomposition`` on each partitioner
before decomposing the program, with real param data: the one place, in executorch 1.5.1, where
a partitioner may change the program it is about to partition. ``partition()`` itself sees fake
params and must leave the graph as it is.
"""

from __future__ import annotations

import logging
import weakref
from typing import Optional

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from torch.export import ExportedProgram

from . import config as settings
from . import pipeline
from .config import Config
from .dim_order import warn_of_conflicts
from .errors import StrictFallback, warn_or_raise
from .passthrough import untag_vanishing_copies
from .steps.fold.rules import DEFAULT_RULES, RuleSet
from .shape_env import for_lowering
from .steps.fold.probe.verified import Verification, make_probe

logger = logging.getLogger("xnnfold")


def _check_program(ep) -> None:
    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"xnnfold expects a torch.export.ExportedProgram, got {type(ep).__name__}; "
            "export the module first: torch.export.export(module, example_inputs)")


class FoldGemmParams:
    """The fold as a pass: ``FoldGemmParams(partitioner)(ep)`` returns a
    :class:`~xnnfold.result.FoldResult` — ``.program`` (a new ExportedProgram, or ``ep``
    itself when ``.modified`` is False), and the record of what was folded and why.

    ``partitioner`` is the XNNPACK partitioner whose verdict the *delegated* rule asks (default:
    a stock ``XnnpackPartitioner()``); it is not changed. ``rules`` is the
    :class:`~xnnfold.steps.fold.rules.RuleSet` to apply (tests pass one without a rule).
    ``config`` (:class:`~xnnfold.config.Config`; default: the settings in force when it runs,
    :func:`xnnfold.config.current`) says whether an internal failure raises (``strict``) and
    whether the whole-program probe checks every answer of the fast one (``verify_probe``, a
    test mode: it costs a second decomposition of the program). ``attention=False`` leaves every
    ``scaled_dot_product_attention`` as stock decomposes it (:mod:`xnnfold.steps.attention`,
    :mod:`xnnfold.steps.kv_cache`). ``llm_kernels=True`` lets the KV-cache step put the cache
    update and the attention over it on executorch's ``llama::update_cache`` and
    ``llama::custom_sdpa`` where that is proven exact: the .pte then needs a runtime with
    executorch's LLM custom ops (the default needs XNNPACK and the portable kernels only).

    ``.program`` is a valid ExportedProgram (``validate()``, ``torch.export.save``); it shares
    ``ep``'s ShapeEnv, so for a program with data-dependent sizes, lowering it leaves unbound
    symbols there, as lowering ``ep`` does (the drop-in :class:`XnnpackPartitioner` lowers a
    copy with a ShapeEnv of its own).
    """

    def __init__(self, partitioner: Optional[StockXnnpackPartitioner] = None,
                 rules: RuleSet = DEFAULT_RULES, config: Optional[Config] = None,
                 attention: bool = True, llm_kernels: bool = False):
        self.partitioner = partitioner if partitioner is not None \
            else StockXnnpackPartitioner()
        self.rules = rules
        self.config = config
        self.attention = attention
        self.llm_kernels = llm_kernels
        self.steps = pipeline.STEPS     # the pass's steps, in order (xnnfold.pipeline)

    def settings(self) -> Config:
        """The :class:`~xnnfold.config.Config` a fold runs with now."""
        return self.config if self.config is not None else settings.current()

    def __call__(self, ep: ExportedProgram, verification: Optional[Verification] = None
                 ) -> pipeline.FoldResult:
        """``verification``: where the probe's answers are verified, with verification on
        (default: each within this fold; the drop-in partitioner passes its own, whose
        ``partition()`` checks the last one: :class:`~.steps.fold.probe.verified.Verification`)."""
        verification = verification if verification is not None else Verification()
        verification.fold_starts()
        _check_program(ep)
        config = self.settings()
        probe = make_probe(self.partitioner, config.verify_probe, verification)
        result = None
        try:
            # The caller's random generator is theirs: whatever the pass's probes and exports
            # draw (a first export's lazy set-up, a module built to be probed) is drawn from a
            # fork.
            with torch.random.fork_rng(devices=[]), settings.using(config):
                result = pipeline.run(ep, probe, self.rules, self.attention, verification,
                                      self.llm_kernels, self.steps)
        finally:
            if result is None or result.fallback is not None:
                verification.fold_failed()   # nothing left to check of a fold given up
        return result


def fold_gemm_params(ep: ExportedProgram,
                     partitioner: Optional[StockXnnpackPartitioner] = None,
                     rules: RuleSet = DEFAULT_RULES,
                     config: Optional[Config] = None,
                     attention: bool = True,
                     prefer: Optional[str] = None,
                     llm_kernels: Optional[bool] = None) -> pipeline.FoldResult:
    """Fold the computed weights and biases of ``ep``'s GEMMs into constants.

    Returns a :class:`~xnnfold.result.FoldResult`: ``.program`` is a new ExportedProgram
    (``ep`` is not modified) to lower with ``to_edge`` + ``to_backend`` or any other path, and
    ``.operands`` says, for every GEMM weight and bias, whether it was plain, folded or declined
    and why. The arguments are :class:`FoldGemmParams`'s; ``prefer`` is
    :class:`XnnpackPartitioner`'s (default: ``partitioner``'s own, if it is xnnfold's), and so
    is ``llm_kernels``.
    """
    if prefer is None and isinstance(partitioner, XnnpackPartitioner):
        prefer = partitioner.fold.rules.prefer
    if llm_kernels is None:
        llm_kernels = isinstance(partitioner, XnnpackPartitioner) and partitioner.fold.llm_kernels
    folder = FoldGemmParams(partitioner, rules.preferring(prefer), config, attention,
                            llm_kernels)
    if isinstance(partitioner, XnnpackPartitioner):
        folder.steps = partitioner.fold.steps       # the steps its configs were opened for
    return folder(ep)


def _fix_passthrough(result) -> None:
    """Untag the copies XNNPACK's preprocess would drop into a delegate it rejects (see
    :mod:`xnnfold.passthrough`); on any failure, the partition stays stock's."""
    graph = result.tagged_exported_program.graph
    tags = {n: n.meta.get("delegation_tag") for n in graph.nodes}
    partition_tags = dict(result.partition_tags)
    try:
        untag_vanishing_copies(graph, partition_tags)
    except Exception as error:  # noqa: BLE001 - stock's partition is still a partition
        for node, tag in tags.items():
            if tag is None:
                node.meta.pop("delegation_tag", None)
            else:
                node.meta["delegation_tag"] = tag
        warn_or_raise(logger, "xnnfold: could not check the partitions for copies XNNPACK "
                      "drops (%s: %s); partitioned as stock partitions", type(error).__name__,
                      error)
        return
    result.partition_tags.clear()
    result.partition_tags.update(partition_tags)


class XnnpackPartitioner(StockXnnpackPartitioner):
    """``executorch``'s XnnpackPartitioner, folding computed GEMM weights and biases first.

    Same constructor, plus ``rules``, ``config``, ``attention`` and ``llm_kernels`` (see
    :class:`FoldGemmParams`) and
    ``prefer``: where speed and size trade (an ``nn.Linear`` head tied to its embedding, which
    stock delegates with a second copy of the table), ``"speed"`` (the default) keeps stock's
    choice and ``"size"`` stores the table once, as a run-time weight repacked on every call.
    Use it
    with ``to_edge_transform_and_lower``; after a lowering, ``last_result`` holds the
    :class:`~xnnfold.result.FoldResult` of the last program. Its configs also take what its
    steps emit, as each step opens them (the step protocol's ``open``): the GEMMs the fold
    marks (a weight that cannot be a constant) with their weight as a run-time input
    (:mod:`xnnfold.steps.runtime_weight`), the attention over a KV cache's visible rows.
    ``partition()`` warns, naming each node, of the ops it leaves outside delegates that the
    runtime will refuse for the dim orders of their tensors (``dim_order_conflicts``; see
    :mod:`xnnfold.dim_order`).
    """

    checks_dim_orders = True     # partition() warns of ops the runtime will refuse

    def __init__(self, *args, rules: RuleSet = DEFAULT_RULES,
                 config: Optional[Config] = None, attention: bool = True,
                 prefer: Optional[str] = None, llm_kernels: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fold = FoldGemmParams(self, rules.preferring(prefer), config, attention,
                                   llm_kernels)
        with settings.using(self.fold.settings()):
            self.fold.steps = self._open(self.fold.steps)
        self.last_result: Optional[pipeline.FoldResult] = None
        self._last_source = None   # weak reference to the program last_result was folded from
        # the probe's answers, the last of a fold checked by partition() (verification on)
        self.verification = Verification(partition_follows=True)
        # what the last partition() left outside delegates that the runtime will refuse
        self.dim_order_conflicts: list = []     # xnnfold.dim_order.DimOrderConflict

    def _open(self, steps) -> tuple:
        """Ask each step what it opens (the step protocol's optional ``open``): the steps to
        run with this partitioner; the configs they need put in place of its own, in order
        (a later step extends what an earlier one put)."""
        opened = []
        for step in steps:
            if not callable(getattr(step, "open", None)):
                opened.append(step)
                continue
            try:
                opening = step.open(self)
            except StrictFallback:
                raise
            except Exception as error:  # noqa: BLE001 - the step left out: stock's lowering
                warn_or_raise(logger, "xnnfold: the %s step is off: it could not open what it "
                              "needs of the partitioner: %s: %s", step.name,
                              type(error).__name__, error)
                continue
            self.target_partitioner_configs.update(opening.configs)
            if opening.step is not None:
                opened.append(opening.step)
        return tuple(opened)

    def __copy__(self):
        # A copy partitions programs of its own (the whole-program probe's copy, in
        # steps/fold/probe/whole.py, partitions each program it is asked about, in the middle
        # of a fold): it must not settle this partitioner's verification.
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied.verification = Verification(partition_follows=True)
        return copied

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram
                                        ) -> ExportedProgram:
        # With verification on, the fold's last answer is checked by the partition() of this
        # lowering rather than by a second decomposition. Several programs folded before any
        # partition() (a multi-method lowering) are checked at once, by the whole program.
        self.last_result = self.fold(exported_program, self.verification)
        self._last_source = weakref.ref(exported_program)
        with settings.using(self.fold.settings()):
            return for_lowering(exported_program, self.last_result.program)

    def partition(self, exported_program: ExportedProgram):
        result = super().partition(exported_program)
        with settings.using(self.fold.settings()):
            _fix_passthrough(result)
            if self.checks_dim_orders:
                self.dim_order_conflicts = warn_of_conflicts(result)
            self.verification.partitioned(result.tagged_exported_program, self.last_result)
        return result

    def result_for(self, exported_program: ExportedProgram) -> Optional[pipeline.FoldResult]:
        """``last_result`` if it was folded from ``exported_program`` (the same object)."""
        source = self._last_source() if self._last_source is not None else None
        return self.last_result if source is exported_program else None
