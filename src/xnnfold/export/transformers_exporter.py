"""transformers' own exporters (``transformers.exporters``, 5.25) lowering through xnnfold.

transformers' ``ExecutorchExporter`` lowers for XNNPACK with executorch's stock
``XnnpackPartitioner``, built in ``prepare_for_xnnpack``, a function of its module that
``export_program`` finds in a private table: no argument, config value or method chooses the
partitioner. :class:`XnnfoldExecutorchExporter` is that exporter with
``xnnfold.XnnpackPartitioner`` as the one difference, registered through transformers' public
``register_backend`` under the export format ``"xnnfold"`` with transformers' own ExecuTorch
runner::

    from xnnfold.export.transformers_exporter import XnnfoldConfig, register

    exporter = register()()                    # or AutoHfExporter.from_config(XnnfoldConfig())
    exported = exporter.export(model, inputs, XnnfoldConfig())
    outputs = exported(**inputs)               # on the ExecuTorch runtime, transformers' runner

It overrides ``export_program``, the extension point ``HfExporter`` documents for a backend, and
runs the stages of ``ExecutorchExporter.export_program`` with transformers' own functions (the
model's preparation, its patches of torch and executorch, its program fixes, its edge and
ExecuTorch configs), some of them private (``_get_backend_config``, ...):
:func:`check_transformers` finds each, and checks that ``ExecutorchExporter.export_program`` is
still the one these stages mirror (transformers 5.25.0), or raises :class:`TransformersMismatch`
naming the version found.

Never worse than stock: where xnnfold's lowering fails, transformers' own
``ExecutorchExporter.export_program`` is run on the same model; if it exports, its program is
returned with one warning (``xnnfold.errors.warn_or_raise``: strict mode raises), and if it
fails too, one line says transformers' reason and whether stock fails the same way
(:class:`ExportFailed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import re

from ..errors import warn_or_raise
from ..partitioner import XnnpackPartitioner
from . import written_inputs
from .transformers import _without_broken_torchvision, import_transformers

logger = logging.getLogger("xnnfold")

EXPORT_FORMAT = "xnnfold"
TESTED_TRANSFORMERS = "5.25.0"
# sha256 of the source of transformers 5.25.0's ExecutorchExporter.export_program (its
# whitespace collapsed): the stages XnnfoldExecutorchExporter.export_program runs.
STOCK_EXPORT_PROGRAM_SHA256 = "ccb9a3c32315573ba1e270f0904ac9a431312e8afc538d5d5152ade9cd5c0571"
# What export_program calls in transformers' exporter module, besides the classes.
_STAGE_FUNCTIONS = ("prepare_for_xnnpack", "apply_patches", "apply_fx_program_fixes",
                    "apply_fx_node_fixes", "to_edge_transform_and_lower",
                    "_get_edge_compile_config", "_get_transform_passes", "_get_backend_config")


class TransformersMismatch(RuntimeError):
    """transformers' exporter is not the one xnnfold's exporter was written against (one line)."""


class ExportFailed(RuntimeError):
    """Neither xnnfold's exporter nor stock's exports the model (one line: why, and whether stock
    fails the same way)."""


tf = import_transformers()
with _without_broken_torchvision():
    try:
        from transformers.exporters import auto as _auto
        from transformers.exporters import exporter_executorch as _stock
        from transformers.exporters.configs import ExecutorchConfig
        from transformers.exporters.exporter_dynamo import DynamoExporter
        from transformers.exporters.runners.runner_executorch import ExecutorchModelRunner
    except ImportError as error:
        raise TransformersMismatch(
            f"transformers {tf.__version__} has no ExecuTorch exporter "
            f"(transformers.exporters, {TESTED_TRANSFORMERS} or later): {error}") from None


def _fingerprint(function) -> str:
    """sha256 of ``function``'s source, whitespace collapsed ("" without a source: a mismatch)."""
    try:
        source = re.sub(r"\s+", " ", inspect.getsource(function)).strip()
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(source.encode()).hexdigest()


def check_transformers() -> None:
    """Raise :class:`TransformersMismatch` unless transformers' exporter has the stages
    :class:`XnnfoldExecutorchExporter` runs, as in transformers 5.25.0."""
    missing = [name for name in _STAGE_FUNCTIONS if not callable(getattr(_stock, name, None))]
    if missing:
        raise TransformersMismatch(
            f"transformers {tf.__version__}'s ExecuTorch exporter has no {', '.join(missing)}: "
            f"xnnfold's exporter runs its stages as in transformers {TESTED_TRANSFORMERS}")
    if _fingerprint(_stock.ExecutorchExporter.export_program) != STOCK_EXPORT_PROGRAM_SHA256:
        raise TransformersMismatch(
            f"transformers {tf.__version__}'s ExecutorchExporter.export_program differs from "
            f"{TESTED_TRANSFORMERS}'s, whose stages xnnfold's exporter runs: use transformers "
            f"{TESTED_TRANSFORMERS} or the stock exporter")


@dataclasses.dataclass
class XnnfoldConfig(ExecutorchConfig):
    """transformers' ``ExecutorchConfig`` under the export format ``"xnnfold"`` (its backend
    must be ``"xnnpack"``): ``AutoHfExporter.from_config`` and ``AutoExportConfig.from_dict``
    find xnnfold's exporter by it."""

    export_format: str = EXPORT_FORMAT


_CALL = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _one_line(error: BaseException) -> str:
    """The error's type and first line, and where torch.export says the user's code raised it."""
    message = str(error)
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    text = f"{type(error).__name__}: {re.sub(r' +', ' ', first)[:300]}"
    _, marker, after = message.partition("The following call raised this error:")
    call = _CALL.search(after) if marker else None
    if call:
        text += f" (at {call.group(1).rsplit('/', 1)[-1]}:{call.group(2)} in {call.group(3)})"
    return text


def _as_stock(config):
    """``config`` under stock's export format: the trace is stock's, and a quantizer checks
    that it supports the format it is traced under."""
    return dataclasses.replace(config, export_format=_stock.ExportFormat.EXECUTORCH)


def _rewritten(result) -> dict:
    if result is None:
        return {}
    counts = {step: sum(1 for r in records if r.rewritten)
              for step, records in result.records.items()}
    return {step: n for step, n in counts.items() if n}


class XnnfoldExecutorchExporter(_stock.ExecutorchExporter):
    """transformers' ``ExecutorchExporter`` lowering with ``xnnfold.XnnpackPartitioner``: its
    ``export``, ``export_for_generation`` and ``save_pretrained`` as they are, its runner."""

    export_format = EXPORT_FORMAT
    config_class = XnnfoldConfig

    def __init__(self):
        super().__init__()               # checks transformers' internals (validate_environment)
        register()                       # its exports run on the runner registered for them
        # Per program lowered with xnnfold's partitioner, in order (export_for_generation: one
        # per component): {step name: sites it rewrote}, what ``xnnfold.explain`` details.
        self.rewritten: list = []

    def validate_environment(self):
        super().validate_environment()
        check_transformers()

    def export_program(self, model, sample_inputs, config):
        if config.backend != "xnnpack":
            raise ValueError(f"xnnfold's exporter lowers for XNNPACK, not backend "
                             f"{config.backend!r}: export with transformers' ExecutorchExporter")
        partitioner = XnnpackPartitioner()
        try:
            lowered = self._lower(model, sample_inputs, config, partitioner)
        except Exception as error:  # noqa: BLE001 - stock decides: fall back, or say both fail
            failure = error
        else:
            self.rewritten.append(_rewritten(partitioner.last_result))
            return lowered
        try:
            program = self._lower_as_stock(model, sample_inputs, config)
        except Exception as stock_error:  # noqa: BLE001 - one line says why, naming both
            reason, stock_reason = _one_line(failure), _one_line(stock_error)
            same = "stock's exporter fails the same way" if stock_reason == reason \
                else f"stock's exporter fails too ({stock_reason})"
            raise ExportFailed(f"{type(model).__name__} does not export: {reason}; {same}") \
                from failure
        warn_or_raise(logger, "xnnfold's exporter failed on %s (%s): exported as stock exports it",
                      type(model).__name__, _one_line(failure))
        return program

    def _lower(self, model, sample_inputs, config, partitioner):
        """``ExecutorchExporter.export_program``'s stages (transformers 5.25.0) for XNNPACK,
        with ``partitioner`` in place of stock's and the inputs a program writes written in
        place (:mod:`.written_inputs`)."""
        model, sample_inputs, _ = _stock.prepare_for_xnnpack(model, sample_inputs)
        with _stock.apply_patches("executorch"), _stock.apply_patches("executorch.xnnpack"):
            exported_program, metadata = DynamoExporter.export_program(
                self, model, sample_inputs, config=_as_stock(config))
            _stock.apply_fx_program_fixes("executorch", exported_program)
            _stock.apply_fx_node_fixes("executorch", exported_program.graph_module)
            # the decode's cache (an input the program writes) written in place, not copied
            # four times a step (written_inputs)
            passes = list(_stock._get_transform_passes(config.backend) or ())
            edge = _stock.to_edge_transform_and_lower(
                exported_program, partitioner=[partitioner],
                compile_config=_stock._get_edge_compile_config(config.backend),
                transform_passes=passes + [written_inputs.drop_retrace_copies])
            program = edge.to_executorch(
                config=written_inputs.backend_config(_stock._get_backend_config(config)))
        return program, metadata

    def _lower_as_stock(self, model, sample_inputs, config):
        """transformers' own ``ExecutorchExporter.export_program``: stock's partitioner."""
        return super().export_program(model, sample_inputs, _as_stock(config))


def register() -> type:
    """Register :class:`XnnfoldExecutorchExporter` and transformers' ExecuTorch runner under the
    export format ``"xnnfold"`` (``transformers.exporters.register_backend``), once; return the
    exporter class. Loading a saved ``"xnnfold"`` export (``ExportedModel.from_pretrained``)
    needs it too."""
    check_transformers()
    try:
        registered = _auto.get_exporter_class(EXPORT_FORMAT)
    except ValueError:
        registered = None
    if registered is not XnnfoldExecutorchExporter:
        _auto.register_backend(XnnfoldExecutorchExporter, ExecutorchModelRunner)
    return XnnfoldExecutorchExporter
