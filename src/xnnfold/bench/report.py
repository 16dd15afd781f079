"""The report: stock against xnnfold against the ideal rewrite (and stock's flag, and
constant_prop_pass).

For each model: GEMMs outside delegates, delegate calls, ops left outside delegates (executorch's
``get_delegation_info``), .pte bytes, outputs vs eager (the max abs diff, or WRONG and why:
:func:`xnnfold.pte.compare.compare_outputs`), lowering seconds and peak RSS (each variant
lowered in a process of its own, :mod:`xnnfold.pte.isolated`), latency on the ExecuTorch
runtime, and where the time goes (ETDump, :func:`xnnfold.pte.devtools.operator_times`).

Latency: all variants are loaded in this process, warmed up, then timed in rounds; every round
runs each variant once, in an order shuffled anew (seeded), so that no variant always runs
right after stock's slow portable call. Quoted as median (min-max) over the rounds and as a
ratio to stock: this machine drifts by about 10% between runs, so only side-by-side ratios
mean anything.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from ..models import catalog
from ..pte.variants import EAGER_EXPORT, IDEAL
from .isolated import lower_isolated
from .charts import plot, plot_operator_times
from ..pte.compare import quantized_tolerance
from ..pte import STOCK, PteRunner, compare_outputs
from ..pte.timing import time_interleaved
from ..usage import first_line
from .tables import PROFILED, VARIANTS, markdown

SCHEMA_VERSION = 3                   # 3: outputs_ok, mismatch, max_rel_diff


@dataclass
class Row:
    model: str
    variant: str
    gemms_outside: Optional[int] = None
    delegate_calls: Optional[int] = None
    ops_delegated: Optional[int] = None          # get_delegation_info's node counts
    ops_outside: Optional[int] = None
    ops_outside_by_type: dict = field(default_factory=dict)
    pte_bytes: Optional[int] = None
    max_abs_diff: Optional[float] = None         # vs eager; nan where not comparable
    max_rel_diff: Optional[float] = None
    outputs_ok: Optional[bool] = None            # compare_outputs' verdict (default tolerance)
    mismatch: Optional[str] = None               # why not ok: "output 0: shape (1,) vs (4,)"
    lower_seconds: Optional[float] = None
    peak_rss_mib: Optional[float] = None
    base_rss_mib: Optional[float] = None
    latency_ms: list = field(default_factory=list)
    op_ms: dict = field(default_factory=dict)    # ETDump: ms per run by portable op / delegate
    gemms: list = field(default_factory=list)    # isolated.gemm_rows: in the user's terms
    error: Optional[str] = None

    @property
    def median_ms(self) -> Optional[float]:
        return statistics.median(self.latency_ms) if self.latency_ms else None


def _error_line(error: Exception) -> str:
    return first_line(error, 200)


def _lower_row(source, variant: str, case, expected, folder: str, verbose: bool):
    row = Row(source.name, variant)
    runner = None
    try:
        lowering = lower_isolated(source, variant, folder, verbose)
        row.gemms = lowering.gemms
        row.gemms_outside, row.delegate_calls = lowering.gemms_outside, lowering.delegate_calls
        row.ops_delegated = lowering.delegation["delegated"]
        row.ops_outside = lowering.delegation["not_delegated"]
        row.ops_outside_by_type = lowering.delegation["not_delegated_by_op"]
        row.pte_bytes = os.path.getsize(lowering.pte_path)
        row.lower_seconds = round(lowering.lower_seconds, 2)
        row.peak_rss_mib = lowering.peak_rss_mib and round(lowering.peak_rss_mib, 1)
        row.base_rss_mib = lowering.base_rss_mib and round(lowering.base_rss_mib, 1)
        if lowering.run_error:            # it failed or aborted in the lowering's process
            row.error = lowering.run_error
            return row, None
        runner = PteRunner(Path(lowering.pte_path).read_bytes())
        tolerance = quantized_tolerance(expected) if source.quantize else {}
        verdict = compare_outputs(runner.run(case.inputs), expected, **tolerance)
        row.outputs_ok, row.mismatch = verdict.ok, verdict.reason
        row.max_abs_diff, row.max_rel_diff = verdict.max_abs_diff, verdict.max_rel_diff
    except Exception as error:  # noqa: BLE001 - a variant that fails is a finding
        row.error, runner = _error_line(error), None
    return row, runner


def measure_model(source, reps: int, variants=VARIANTS, seed: int = 0, profile: bool = True,
                  folder: Optional[str] = None, progress=None, verbose: bool = False,
                  case=None) -> list:
    """Rows for every variant of one model: a :class:`~xnnfold.models.sources.ModelSource`, or
    a built-in or zoo model's name (``case``: its case, if built already)."""
    from ..pte.devtools import operator_times
    from ..models.sources import ModelSource, export

    source = ModelSource(source) if isinstance(source, str) else source
    case = source.build() if case is None else case
    if source.user:
        export(case)      # the user's model: a model that does not export fails here, at once
    with torch.no_grad():
        expected = case.model(*case.inputs)
    rows, runners = [], {}
    present = variants_of(case, variants)
    with tempfile.TemporaryDirectory() as scratch:
        for variant in present:
            row, runner = _lower_row(source, variant, case, expected, folder or scratch,
                                     verbose)
            rows.append(row)
            if runner is not None:
                runners[variant] = runner
            if progress is not None:
                progress.update(1)
        by_variant = {r.variant: r for r in rows}
        for variant, times in time_interleaved(runners, case.inputs, reps, seed).items():
            by_variant[variant].latency_ms = times
        for variant in PROFILED if profile else ():
            if variant in runners:
                try:
                    by_variant[variant].op_ms = operator_times(runners[variant]._buffer,
                                                               case.inputs)
                except Exception as error:  # noqa: BLE001 - no breakdown, say why
                    by_variant[variant].op_ms = {"failed": _error_line(error)}
    return rows


def variants_of(case, variants) -> list:
    """The ``variants`` ``case`` has: ideal and eager-export only where it has one."""
    return [v for v in variants if not (v == IDEAL and case.ideal is None)
            and not (v == EAGER_EXPORT and case.eager_export is None)]


def model_names(size: str, names: Optional[list] = None) -> list:
    """``names`` checked (built-in and zoo names, factories and .pt2 files), or the ``size``
    set's names."""
    from ..models.sources import is_user_spec

    if names:
        unknown = [n for n in names if n not in catalog.KNOWN and not is_user_spec(n)]
        if unknown:
            raise KeyError(catalog.unknown_model_message(unknown[0]))
        return names
    return list({"small": catalog.SMALL, "large": catalog.LARGE,
                 "all": catalog.SMALL + catalog.LARGE}[size])


def _known() -> list:
    return list(catalog.KNOWN)


def run_report(size: str = "small", names: Optional[list] = None, reps: int = 20,
               out: Optional[Path] = None, show_progress: bool = True, variants=VARIANTS,
               seed: int = 0, profile: bool = True, verbose: bool = False,
               on_skip=None, quantize: Optional[str] = None, charts: bool = True) -> dict:
    """Measure ``names`` (or the ``size`` set): built-in and zoo names, ``package.module:
    function`` factories, .pt2 files; with ``quantize`` ("dynamic" or "static"), each model
    PT2E-quantized first. A zoo model whose package does not import is skipped, its one-line
    reason in ``report["skipped"]`` and passed to ``on_skip``. ``charts=False`` writes the
    .md and .json only (matplotlib missing)."""
    from ..models.sources import ModelSource
    from ..export.transformers import TransformersUnavailable

    names = model_names(size, names)
    sources = [ModelSource.of(name, quantize) for name in names]
    # Every model built first, so that the progress bar's total, the variants each model has
    # (ideal and eager-export where it has one), is right from the start and never changes.
    cases, rows, skipped = {}, [], {}
    for name, source in zip(names, sources):
        try:
            cases[name] = source.build()
        except TransformersUnavailable as error:
            skipped[name] = str(error)
            if on_skip is not None:
                on_skip(name, str(error))
    total = sum(len(variants_of(case, variants)) for case in cases.values())
    with tqdm(total=total, desc="lowering", unit="variant",
              disable=not show_progress) as progress:
        for name, source in zip(names, sources):
            if name in cases:
                progress.set_postfix_str(source.name)
                rows.extend(measure_model(source, reps, variants, seed, profile,
                                          progress=progress, verbose=verbose,
                                          case=cases.pop(name)))     # measured: let it go
    report = {"schema": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": _machine(), "reps": reps, "seed": seed,
              "order": "shuffled every round", "skipped": skipped,
              "rows": [_row_dict(r, rows) for r in rows]}
    if out is not None:
        write(report, Path(out), charts)
    return report


CHARTS = ("latency.png", "operators.png")


def write(report: dict, out: Path, charts: bool = True) -> list:
    """report.json, report.md and the charts that have something to show, in ``out``; a chart
    of an earlier run left there is removed (it would describe another run). Returns the names
    of the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    drawn = []
    if charts:
        drawn += ["latency.png"] if plot(report, out / "latency.png") else []
        drawn += ["operators.png"] if plot_operator_times(report, out / "operators.png") else []
    for stale in set(CHARTS) - set(drawn):
        (out / stale).unlink(missing_ok=True)
    (out / "report.md").write_text(markdown(report, drawn if charts else None))
    return ["report.md", "report.json", *drawn]


def _machine() -> str:
    from importlib.metadata import version
    return (f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"executorch {version('executorch')}")


def _row_dict(row: Row, rows: list) -> dict:
    data = asdict(row)
    data["median_ms"] = row.median_ms
    data["min_ms"] = min(row.latency_ms) if row.latency_ms else None
    data["max_ms"] = max(row.latency_ms) if row.latency_ms else None
    data["rounds"] = len(row.latency_ms)
    stock = next((r for r in rows if r.model == row.model and r.variant == STOCK), None)
    data["ratio_to_stock"] = (row.median_ms / stock.median_ms
                              if stock and stock.median_ms and row.median_ms else None)
    del data["latency_ms"]
    return data
