"""The report: stock against xnnfold against the ideal rewrite (and constant_prop_pass).

For each built-in model: GEMMs outside delegates, delegate calls, .pte bytes, max abs diff vs
eager, lowering seconds, and latency on the ExecuTorch runtime. Latencies are measured in one
process, interleaved (stock, xnnfold, ideal, constant_prop_pass, stock, ...), after warm-up,
and quoted as median (min-max) and as a ratio to stock: this machine drifts by about 10%
between runs, so only side-by-side ratios mean anything.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from tabulate import tabulate
from tqdm import tqdm

from . import models
from .measure import CONSTANT_PROP, STOCK, XNNFOLD, PteRunner, lower, max_abs_diff

IDEAL = "ideal"
VARIANTS = (STOCK, XNNFOLD, IDEAL, CONSTANT_PROP)
SCHEMA_VERSION = 1


@dataclass
class Row:
    model: str
    variant: str
    gemms_outside: Optional[int] = None
    delegate_calls: Optional[int] = None
    pte_bytes: Optional[int] = None
    max_abs_diff: Optional[float] = None
    lower_seconds: Optional[float] = None
    latency_ms: list = field(default_factory=list)
    error: Optional[str] = None

    @property
    def median_ms(self) -> Optional[float]:
        return statistics.median(self.latency_ms) if self.latency_ms else None


def _lower_variant(case: models.Case, variant: str, exported: dict):
    """Lower one variant; ``exported`` caches each module's export (it costs a second)."""
    module = case.ideal if variant == IDEAL else case.model
    if module is None:
        return None
    if id(module) not in exported:
        exported[id(module)] = torch.export.export(module, case.inputs,
                                                   dynamic_shapes=case.dynamic_shapes)
    return lower(exported[id(module)], STOCK if variant == IDEAL else variant)


def measure_model(name: str, reps: int, warmup: int = 3, progress=None) -> list:
    """Rows for every variant of one built-in model."""
    case = models.build(name)
    with torch.no_grad():
        expected = case.model(*case.inputs)
    rows, runners, exported = [], {}, {}
    for variant in VARIANTS:
        row = Row(name, variant)
        try:
            lowered = _lower_variant(case, variant, exported)
            if lowered is None:
                continue
            runner = PteRunner(lowered.pte)
            row.gemms_outside = len(lowered.gemms_outside)
            row.delegate_calls = lowered.delegate_calls
            row.pte_bytes = lowered.pte_bytes
            row.lower_seconds = round(lowered.lower_seconds, 2)
            row.max_abs_diff = max_abs_diff(runner.run(case.inputs), expected)
            runners[variant] = runner
        except Exception as error:  # noqa: BLE001 - a variant that fails is a finding
            row.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        rows.append(row)
        if progress is not None:
            progress.update(1)
    by_variant = {r.variant: r for r in rows}
    for runner in runners.values():
        for _ in range(warmup):
            runner.run(case.inputs)
    for _ in range(reps):            # interleaved: drift hits every variant alike
        for variant, runner in runners.items():
            start = time.perf_counter()
            runner.run(case.inputs)
            by_variant[variant].latency_ms.append((time.perf_counter() - start) * 1e3)
    return rows


def model_names(size: str, names: Optional[list] = None) -> list:
    if names:
        for name in names:
            models.build(name)   # raises KeyError naming the unknown model
        return names
    return list({"small": models.SMALL, "large": models.LARGE, "all": models.ALL}[size])


def run_report(size: str = "small", names: Optional[list] = None, reps: int = 20,
               out: Optional[Path] = None, show_progress: bool = True) -> dict:
    names = model_names(size, names)
    rows = []
    with tqdm(total=len(names) * len(VARIANTS), desc="lowering", unit="variant",
              disable=not show_progress) as progress:
        for name in names:
            progress.set_postfix_str(name)
            rows.extend(measure_model(name, reps, progress=progress))
    report = {"schema": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": _machine(), "reps": reps, "rows": [_row_dict(r, rows) for r in rows]}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2))
        (out / "report.md").write_text(markdown(report))
        plot(report, out / "latency.png")
    return report


def _machine() -> str:
    from importlib.metadata import version
    return (f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"executorch {version('executorch')}")


def _row_dict(row: Row, rows: list) -> dict:
    data = asdict(row)
    data["median_ms"] = row.median_ms
    data["min_ms"] = min(row.latency_ms) if row.latency_ms else None
    data["max_ms"] = max(row.latency_ms) if row.latency_ms else None
    stock = next((r for r in rows if r.model == row.model and r.variant == STOCK), None)
    data["ratio_to_stock"] = (row.median_ms / stock.median_ms
                              if stock and stock.median_ms and row.median_ms else None)
    del data["latency_ms"]
    return data


def table(report: dict, fmt: str = "simple") -> str:
    headers = ["model", "variant", "GEMMs outside", "delegate calls", ".pte bytes",
               "max abs diff", "lower s", "latency ms median (min-max)", "vs stock"]
    body = []
    for r in report["rows"]:
        if r["error"]:
            body.append([r["model"], r["variant"], "", "", "", "", "", f"failed: {r['error']}", ""])
            continue
        latency = (f"{r['median_ms']:.3f} ({r['min_ms']:.3f}-{r['max_ms']:.3f})"
                   if r["median_ms"] is not None else "")
        ratio = f"{r['ratio_to_stock']:.3f}" if r["ratio_to_stock"] is not None else ""
        body.append([r["model"], r["variant"], r["gemms_outside"], r["delegate_calls"],
                     f"{r['pte_bytes']:,}", f"{r['max_abs_diff']:.1e}", r["lower_seconds"],
                     latency, ratio])
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def ideal_table(report: dict, fmt: str = "simple") -> str:
    """xnnfold beside the ideal rewrite, for the models that have one: what is left to gain."""
    body = []
    for name in dict.fromkeys(r["model"] for r in report["rows"]):
        found = {r["variant"]: r for r in report["rows"] if r["model"] == name}
        folded, ideal = found.get(XNNFOLD), found.get(IDEAL)
        if not folded or not ideal or folded["error"] or ideal["error"]:
            continue
        latency = (f"{folded['median_ms'] / ideal['median_ms']:.3f}"
                   if folded["median_ms"] and ideal["median_ms"] else "")
        body.append([name, f"{folded['delegate_calls']} / {ideal['delegate_calls']}",
                     f"{folded['pte_bytes']:,} / {ideal['pte_bytes']:,}",
                     f"{folded['pte_bytes'] - ideal['pte_bytes']:+,}", latency])
    return tabulate(body, headers=["model", "delegate calls xnnfold / ideal",
                                   ".pte bytes xnnfold / ideal", "bytes vs ideal",
                                   "latency xnnfold / ideal"],
                    tablefmt=fmt, disable_numparse=True)


def markdown(report: dict) -> str:
    return (f"# xnnfold report\n\n{report['date']} · {report['machine']} · {report['reps']} "
            f"interleaved reps after warm-up\n\n{table(report, 'github')}\n\n"
            f"## xnnfold beside the ideal rewrite\n\n{ideal_table(report, 'github')}\n\n"
            "![latency](latency.png)\n")


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in report["rows"]))
    width = 0.8 / len(VARIANTS)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4))
    for index, variant in enumerate(VARIANTS):
        values = [next((r["median_ms"] for r in report["rows"] if r["model"] == name
                        and r["variant"] == variant and r["median_ms"]), 0) for name in names]
        wrong = any(r["variant"] == variant and (r["max_abs_diff"] or 0) > 1e-3
                    for r in report["rows"])
        label = f"{variant} (wrong outputs)" if wrong and variant != STOCK else variant
        ax.bar([i + index * width for i in range(len(names))], values, width, label=label,
               hatch="//" if wrong and variant != STOCK else None)
    ax.set_yscale("log")
    ax.set_ylabel("latency, ms (median, log scale)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8, ncol=len(VARIANTS), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.set_title("ExecuTorch runtime latency: stock vs xnnfold vs ideal", pad=24)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
