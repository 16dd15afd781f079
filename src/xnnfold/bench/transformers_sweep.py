"""transformers' exporter, stock against xnnfold, over the model classes transformers' auto
mappings build at tiny dims (:mod:`.tiny_models`): what ``xnnfold bench transformers-sweep``
writes.

Each class is measured in a process of its own (``python -m xnnfold.bench.transformers_sweep
CLASS MODEL_TYPE RESULT.json``, killed after a timeout): built from its tiny config (seeded),
run in eager, then exported through transformers' ``ExecutorchExporter.export`` (stock's
partitioner) and through xnnfold's exporter (``register()``: the ``"xnnfold"`` format), each
.pte run on transformers' runner and judged against eager by :func:`xnnfold.pte.compare_outputs`
at each row's scale, its delegate calls, ops outside delegates and their share of the run's time
(ETDump), its bytes, and both timed side by side (interleaved rounds, one process). The child
rewrites its JSON after each stage, so a process that aborts or times out still leaves what it
measured; the parent appends one row per class to ``sweep.csv`` (a class already there is
skipped: the sweep resumes) and rewrites ``sweep.md``.
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("stock", "xnnfold")
PER_VARIANT = ("export", "verdict", "calls", "outside", "portable_share", "bytes", "ms",
               "export_s")
FIELDS = ("class", "model_type", "error", *(f"{v}_{c}" for v in VARIANTS for c in PER_VARIANT),
          "ratio", "rewritten", "xnnfold_warning")


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


def measure(class_name: str, model_type: str, result_path: str, rounds: int = 20) -> dict:
    """One class, stock and xnnfold; the row is rewritten to ``result_path`` after each stage."""
    import torch
    import transformers
    from transformers.exporters.exporter_executorch import ExecutorchConfig, ExecutorchExporter

    from xnnfold.export import transformers_exporter as xt
    from xnnfold.pte import PteRunner, inspect_lowered
    from xnnfold.pte.devtools import DELEGATE, operator_times
    from xnnfold.pte.timing import time_interleaved

    from .tiny_models import redraw_zero_parameters, sample_inputs, tiny_config

    row = {"class": class_name, "model_type": model_type}

    def save():
        Path(result_path).write_text(json.dumps(row))

    torch.manual_seed(0)
    try:
        model = getattr(transformers, class_name)(tiny_config(model_type)).eval()
        inputs = sample_inputs(model, torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected = model(**copy.deepcopy(inputs))
            if _all_zero(expected) and redraw_zero_parameters(model,
                                                              torch.Generator().manual_seed(1)):
                expected = model(**copy.deepcopy(inputs))
    except Exception as error:  # noqa: BLE001 - a class the sweep cannot build is a row
        row["error"] = f"not built: {xt._one_line(error)}"
        save()
        return row
    exporters = {"stock": (ExecutorchExporter, lambda: ExecutorchConfig(backend="xnnpack")),
                 "xnnfold": (xt.register(), xt.XnnfoldConfig)}
    runners, feeds = {}, {}
    for variant, (exporter_class, config) in exporters.items():
        exporter, caught = exporter_class(), _Warnings()
        logging.getLogger("xnnfold").addHandler(caught)
        start = time.perf_counter()
        try:
            exported = exporter.export(model, copy.deepcopy(inputs), config())
        except Exception as error:  # noqa: BLE001 - the reason is the row's finding
            row[f"{variant}_export"] = str(error) if isinstance(error, xt.ExportFailed) \
                else xt._one_line(error)
            continue
        finally:
            logging.getLogger("xnnfold").removeHandler(caught)
            row[f"{variant}_export_s"] = round(time.perf_counter() - start, 1)
        fell_back = any("exported as stock exports it" in m for m in caught.messages)
        row[f"{variant}_export"] = "stock's fallback" if fell_back else "yes"
        if variant == "xnnfold":
            row["rewritten"] = json.dumps(getattr(exporter, "rewritten", []))
            row["xnnfold_warning"] = caught.messages[0] if caught.messages else ""
        pte = exported.program.buffer
        ops, calls, _, _ = inspect_lowered(exported.program.exported_program())
        outside = [op for op in ops if op != "alloc"]       # memory planning's, not an op
        row.update({f"{variant}_calls": calls, f"{variant}_outside": len(outside),
                    f"{variant}_bytes": len(pte)})
        save()
        row[f"{variant}_verdict"] = _verdict(exported(**copy.deepcopy(inputs)), expected)
        save()
        feeds[variant] = _feed(exported, copy.deepcopy(inputs))
        times = operator_times(pte, feeds[variant], runs=10)
        total = sum(times.values())
        row[f"{variant}_portable_share"] = round(
            (total - times.get(DELEGATE, 0.0)) / total, 3) if total else 0.0
        runners[variant] = PteRunner(pte)
        save()
    if len(runners) == 2:
        times = time_interleaved(runners, feeds["stock"], rounds)
        medians = {v: statistics.median(t) for v, t in times.items()}
        row.update({f"{v}_ms": round(m, 4) for v, m in medians.items()})
        row["ratio"] = round(medians["xnnfold"] / medians["stock"], 3)
    save()
    return row


def done_classes(table: Path) -> set:
    if not table.exists():
        return set()
    with open(table, newline="") as file:
        return {row["class"] for row in csv.DictReader(file)}


def _run_one(class_name: str, model_type: str, folder: Path, timeout: float,
             rounds: int) -> dict:
    result = folder / "rows" / f"{class_name}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", __name__, class_name, model_type, str(result), str(rounds)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    error = None
    try:
        done = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            error = f"process exited {done.returncode}: {lines[-1][:300] if lines else ''}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:.0f} s"
    row = json.loads(result.read_text()) if result.exists() else \
        {"class": class_name, "model_type": model_type}
    if error and not row.get("error"):
        row["error"] = error
    return row


def sweep(folder: Path, pattern: str = "", limit: int = 0, timeout: float = 900,
          rounds: int = 20, echo=print) -> list:
    """Measure the classes matching ``pattern`` not yet in ``folder/sweep.csv`` (at most
    ``limit``, 0: all), each in a process of its own; returns the rows written."""
    from .tiny_models import model_classes
    from .transformers_sweep_table import write_markdown

    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "sweep.csv"
    done = done_classes(table)
    todo = [(c, t) for c, t in model_classes() if re.search(pattern, c) and c not in done]
    todo = todo[:limit] if limit else todo
    rows = []
    for index, (class_name, model_type) in enumerate(todo, 1):
        start = time.perf_counter()
        row = _run_one(class_name, model_type, folder, timeout, rounds)
        new = not table.exists()
        with open(table, "a", newline="") as file:
            writer = csv.DictWriter(file, FIELDS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(row)
        rows.append(row)
        echo(f"[{index}/{len(todo)}] {class_name}: stock {row.get('stock_export', '-')}, "
             f"xnnfold {row.get('xnnfold_export', '-')}, ratio {row.get('ratio', '-')}"
             f"{', ' + row['error'] if row.get('error') else ''} "
             f"({time.perf_counter() - start:.0f} s)")
        write_markdown(table, folder / "sweep.md")
    return rows


if __name__ == "__main__":
    from xnnfold.pte.quiet import silence_python

    silence_python()
    measure(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
