"""One class of the transformers sweep (:mod:`.transformers_sweep`), measured in a process of
its own: built from its tiny config (seeded), run in eager, then exported through transformers'
``ExecutorchExporter.export`` three ways: stock's partitioner (``"stock"``), stock's with its
``force_non_static_weights_for_f32_linear`` flag (``"stock_flag"``) and xnnfold's exporter
(``register()``: ``"xnnfold"``). Each .pte is run on transformers' runner and judged against
eager by :func:`xnnfold.pte.compare_outputs` at each row's scale; its delegate calls, ops outside
delegates and their share of the run's time (ETDump), its bytes; and the three timed side by
side (interleaved rounds, one process). The row is rewritten to its JSON file after each stage,
so a process that aborts or times out still leaves what it measured.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import statistics
import time
from pathlib import Path

VARIANTS = ("stock", "stock_flag", "xnnfold")
PER_VARIANT = ("export", "verdict", "calls", "outside", "portable_share", "bytes", "ms",
               "export_s")
# ratio: xnnfold / stock, ratio_flag: xnnfold / stock with its flag (median ms)
DOES_NOT_RUN = "does not run"       # a verdict: the .pte fails on transformers' runner
RATIOS = {"ratio": "stock", "ratio_flag": "stock_flag"}


class _Warnings(logging.Handler):
    """xnnfold's warnings while it exports (a site's fallback, the exporter's to stock)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(re.sub(r"\s+", " ", record.getMessage())[:300])


def _verdict(outputs, expected) -> str:
    from xnnfold.pte import compare_outputs

    names = list(outputs.keys()) if hasattr(outputs, "keys") else None
    if names is None:
        return str(compare_outputs(outputs, expected, per_row=True))
    for name in names:
        if name not in expected or expected[name] is None:
            return f"WRONG: output {name} not in eager's"
        verdict = compare_outputs(outputs[name], expected[name], per_row=True)
        if not verdict.ok:
            return f"WRONG: {name}: {verdict.reason}"
    worst = max((compare_outputs(outputs[n], expected[n], per_row=True).max_abs_diff
                 for n in names), default=0.0)
    return f"ok {worst:.1e}"


def _all_zero(outputs) -> bool:
    import torch
    from torch.utils import _pytree as pytree

    tensors = [t for t in pytree.tree_leaves(dict(outputs) if hasattr(outputs, "keys") else outputs)
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return bool(tensors) and not any(bool(t.any()) for t in tensors)


def _feed(exported, inputs) -> tuple:
    """The .pte's flat inputs, as transformers' runner flattens them."""
    import torch
    import torch.fx._pytree as fx_pytree

    runner = exported.runners["model"]
    leaves = fx_pytree.tree_flatten_spec(((), {**runner.metadata.in_constants, **inputs}),
                                         runner.in_spec)
    return tuple(leaf.contiguous() if isinstance(leaf, torch.Tensor) else
                 None if isinstance(leaf, str) else leaf for leaf in leaves)


def flag_exporter() -> type:
    """transformers' exporter's own stages (those xnnfold's exporter runs) with stock's
    partitioner and its ``force_non_static_weights_for_f32_linear`` flag, and no fallback: what
    a user of stock's flag gets."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from xnnfold.export import transformers_exporter as xt

    class StockFlagExporter(xt.XnnfoldExecutorchExporter):
        def export_program(self, model, sample_inputs, config):
            flagged = XnnpackPartitioner(force_non_static_weights_for_f32_linear=True)
            return self._lower(model, sample_inputs, config, flagged)

    return StockFlagExporter


def exporters() -> dict:
    """``{variant: (exporter class, config factory)}``, in :data:`VARIANTS`' order."""
    from transformers.exporters.exporter_executorch import ExecutorchConfig, ExecutorchExporter

    from xnnfold.export import transformers_exporter as xt

    return {"stock": (ExecutorchExporter, lambda: ExecutorchConfig(backend="xnnpack")),
            "stock_flag": (flag_exporter(), xt.XnnfoldConfig),
            "xnnfold": (xt.register(), xt.XnnfoldConfig)}


def _build(class_name: str, model_type: str):
    import torch
    import transformers

    from .tiny_models import redraw_zero_parameters, sample_inputs, tiny_config

    torch.manual_seed(0)
    model = getattr(transformers, class_name)(tiny_config(model_type)).eval()
    inputs = sample_inputs(model, torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs))
        if _all_zero(expected) and redraw_zero_parameters(model, torch.Generator().manual_seed(1)):
            expected = model(**copy.deepcopy(inputs))
    return model, inputs, expected


def _export(row: dict, variant: str, exporter, config, model, inputs):
    """One export into ``row``; the exported model, or None (the reason in the row)."""
    from xnnfold.export import transformers_exporter as xt
    from xnnfold.pte import inspect_lowered

    caught = _Warnings()
    logging.getLogger("xnnfold").addHandler(caught)
    start = time.perf_counter()
    try:
        exported = exporter.export(model, copy.deepcopy(inputs), config())
    except Exception as error:  # noqa: BLE001 - the reason is the row's finding
        row[f"{variant}_export"] = str(error) if isinstance(error, xt.ExportFailed) \
            else xt._one_line(error)
        return None
    finally:
        logging.getLogger("xnnfold").removeHandler(caught)
        row[f"{variant}_export_s"] = round(time.perf_counter() - start, 1)
    fell_back = any("exported as stock exports it" in m for m in caught.messages)
    row[f"{variant}_export"] = "stock's fallback" if fell_back else "yes"
    if variant == "xnnfold":
        row["rewritten"] = json.dumps(getattr(exporter, "rewritten", []))
        row["xnnfold_warning"] = caught.messages[0] if caught.messages else ""
    ops, calls, _, _ = inspect_lowered(exported.program.exported_program())
    outside = [op for op in ops if op != "alloc"]       # memory planning's, not an op
    row.update({f"{variant}_calls": calls, f"{variant}_outside": len(outside),
                f"{variant}_bytes": len(exported.program.buffer)})
    return exported


def measure(class_name: str, model_type: str, result_path: str, rounds: int = 20) -> dict:
    """One class, the three variants; the row is rewritten to ``result_path`` after each
    stage."""
    from xnnfold.export import transformers_exporter as xt
    from xnnfold.pte import PteRunner
    from xnnfold.pte.devtools import DELEGATE, operator_times
    from xnnfold.pte.quiet import failure_summary, runtime_log
    from xnnfold.pte.timing import time_interleaved

    row = {"class": class_name, "model_type": model_type}

    def save():
        Path(result_path).write_text(json.dumps(row))

    try:
        model, inputs, expected = _build(class_name, model_type)
    except Exception as error:  # noqa: BLE001 - a class the sweep cannot build is a row
        row["error"] = f"not built: {xt._one_line(error)}"
        save()
        return row
    runners, feeds = {}, {}
    for variant, (exporter_class, config) in exporters().items():
        exported = _export(row, variant, exporter_class(), config, model, inputs)
        save()
        if exported is None:
            continue
        with runtime_log() as log:
            try:
                row[f"{variant}_verdict"] = _verdict(exported(**copy.deepcopy(inputs)), expected)
            except Exception as error:  # noqa: BLE001 - a .pte that does not run is a finding
                said = failure_summary(log)
                row[f"{variant}_verdict"] = f"{DOES_NOT_RUN}: {xt._one_line(error)}" + (
                    f" ({said})" if said else "")
                save()
                continue
        save()
        pte = exported.program.buffer
        feeds[variant] = _feed(exported, copy.deepcopy(inputs))
        times = operator_times(pte, feeds[variant], runs=10)
        total = sum(times.values())
        row[f"{variant}_portable_share"] = round(
            (total - times.get(DELEGATE, 0.0)) / total, 3) if total else 0.0
        runners[variant] = PteRunner(pte)
        save()
    if len(runners) >= 2:
        times = time_interleaved(runners, next(iter(feeds.values())), rounds)
        medians = {v: statistics.median(t) for v, t in times.items()}
        row.update({f"{v}_ms": round(m, 4) for v, m in medians.items()})
        for column, against in RATIOS.items():
            if "xnnfold" in medians and against in medians:
                row[column] = round(medians["xnnfold"] / medians[against], 3)
    save()
    return row


def measure_in_child(send, class_name: str, model_type: str, result_path: str,
                     rounds: int, threads: int) -> None:
    """:func:`measure` in a process forked from the sweep's warmed forkserver
    (:mod:`.transformers_sweep_warm`, which ran on one torch thread), on ``threads`` torch
    threads (the sweep's own); ``send``: the row to the parent."""
    import torch

    from xnnfold.pte.quiet import quiet

    torch.set_num_threads(threads)
    quiet(python=False)         # the runtime's failure lines, for a .pte that does not run
    send(measure(class_name, model_type, result_path, rounds))


def warm_up() -> None:
    """Export a tiny BERT with each exporter (not run): torch.export's and executorch's lazy
    imports and caches, once."""
    for exporter_class, config in exporters().values():
        model, inputs, _ = _build("BertModel", "bert")
        exporter_class().export(model, inputs, config())
