"""The report: stock against xnnfold against the ideal rewrite (and stock's flag, and
constant_prop_pass).

For each model: GEMMs outside delegates, delegate calls, ops left outside delegates (executorch's
``get_delegation_info``), .pte bytes, outputs vs eager (the max abs diff, or WRONG and why:
:func:`xnnfold.bench.compare.compare_outputs`), lowering seconds and peak RSS (each variant
lowered in a process of its own, :mod:`xnnfold.bench.isolated`), latency on the ExecuTorch
runtime, and where the time goes (ETDump, :func:`xnnfold.bench.devtools.operator_times`).

Latency: all variants are loaded in this process, warmed up, then timed in rounds; every round
runs each variant once, in an order shuffled anew (seeded), so that no variant always runs
right after stock's slow portable call. Quoted as median (min-max) over the rounds and as a
ratio to stock: this machine drifts by about 10% between runs, so only side-by-side ratios
mean anything.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from tabulate import tabulate
from tqdm import tqdm

from . import models
from .isolated import EAGER_EXPORT, IDEAL, lower_isolated
from .measure import (CONSTANT_PROP, STOCK, STOCK_FLAG, XNNFOLD, XNNFOLD_SIZE, PteRunner,
                      compare_outputs)

VARIANTS = (STOCK, XNNFOLD, XNNFOLD_SIZE, STOCK_FLAG, IDEAL, EAGER_EXPORT, CONSTANT_PROP)
PROFILED = (STOCK, XNNFOLD)          # the variants whose time the ETDump breaks down
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
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def _lower_row(source, variant: str, case, expected, folder: str, verbose: bool):
    row = Row(source.name, variant)
    runner = None
    try:
        lowering = lower_isolated(source, variant, folder, verbose)
        row.gemms = lowering.gemms
        runner = PteRunner(Path(lowering.pte_path).read_bytes())
        row.gemms_outside, row.delegate_calls = lowering.gemms_outside, lowering.delegate_calls
        row.ops_delegated = lowering.delegation["delegated"]
        row.ops_outside = lowering.delegation["not_delegated"]
        row.ops_outside_by_type = lowering.delegation["not_delegated_by_op"]
        row.pte_bytes = len(runner._buffer)
        row.lower_seconds = round(lowering.lower_seconds, 2)
        row.peak_rss_mib = lowering.peak_rss_mib and round(lowering.peak_rss_mib, 1)
        row.base_rss_mib = lowering.base_rss_mib and round(lowering.base_rss_mib, 1)
        verdict = compare_outputs(runner.run(case.inputs), expected)
        row.outputs_ok, row.mismatch = verdict.ok, verdict.reason
        row.max_abs_diff, row.max_rel_diff = verdict.max_abs_diff, verdict.max_rel_diff
    except Exception as error:  # noqa: BLE001 - a variant that fails is a finding
        row.error, runner = _error_line(error), None
    return row, runner


def time_interleaved(runners: dict, inputs: tuple, rounds: int, seed: int = 0,
                     warmup: int = 3) -> dict:
    """``{variant: [ms, ...]}``: ``rounds`` rounds, each variant once per round, in an order
    shuffled every round by a ``random.Random(seed)``."""
    for runner in runners.values():
        for _ in range(warmup):
            runner.run(inputs)
    order, rng = list(runners), random.Random(seed)
    times: dict = {variant: [] for variant in runners}
    for _ in range(rounds):
        rng.shuffle(order)
        for variant in order:
            start = time.perf_counter()
            runners[variant].run(inputs)
            times[variant].append((time.perf_counter() - start) * 1e3)
    return times


def measure_model(source, reps: int, variants=VARIANTS, seed: int = 0, profile: bool = True,
                  folder: Optional[str] = None, progress=None, verbose: bool = False) -> list:
    """Rows for every variant of one model: a :class:`~xnnfold.bench.sources.ModelSource`, or
    a built-in or zoo model's name."""
    from .devtools import operator_times
    from .sources import ModelSource, export

    source = ModelSource(source) if isinstance(source, str) else source
    case = source.build()
    if source.user:
        export(case)      # the user's model: a model that does not export fails here, at once
    with torch.no_grad():
        expected = case.model(*case.inputs)
    rows, runners = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for variant in variants:
            if (variant == IDEAL and case.ideal is None) or \
                    (variant == EAGER_EXPORT and case.eager_export is None):
                continue
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


def model_names(size: str, names: Optional[list] = None) -> list:
    """``names`` checked (built-in and zoo names, factories and .pt2 files), or the ``size``
    set's names."""
    from .sources import is_user_spec

    if names:
        unknown = [n for n in names if n not in _known() and not is_user_spec(n)]
        if unknown:
            raise KeyError(f"unknown model {unknown[0]!r}; known: {', '.join(_known())}, or "
                           "package.module:function, or a .pt2 file")
        return names
    return list({"small": models.SMALL, "large": models.LARGE, "all": models.ALL}[size])


def _known() -> list:
    from .zoo import ZOO
    return [*models.ALL, *ZOO]


def run_report(size: str = "small", names: Optional[list] = None, reps: int = 20,
               out: Optional[Path] = None, show_progress: bool = True, variants=VARIANTS,
               seed: int = 0, profile: bool = True, verbose: bool = False,
               on_skip=None, quantize: Optional[str] = None, charts: bool = True) -> dict:
    """Measure ``names`` (or the ``size`` set): built-in and zoo names, ``package.module:
    function`` factories, .pt2 files; with ``quantize`` ("dynamic" or "static"), each model
    PT2E-quantized first. A zoo model whose package does not import is skipped, its one-line
    reason in ``report["skipped"]`` and passed to ``on_skip``. ``charts=False`` writes the
    .md and .json only (matplotlib missing)."""
    from .sources import ModelSource
    from .zoo import ZooUnavailable

    names = model_names(size, names)
    sources = [ModelSource.of(name, quantize) for name in names]
    rows, skipped = [], {}
    with tqdm(total=len(names) * len(variants), desc="lowering", unit="variant",
              disable=not show_progress) as progress:
        for name, source in zip(names, sources):
            progress.set_postfix_str(source.name)
            try:
                rows.extend(measure_model(source, reps, variants, seed, profile,
                                          progress=progress, verbose=verbose))
            except ZooUnavailable as error:
                skipped[name] = str(error)
                progress.update(len(variants))
                if on_skip is not None:
                    on_skip(name, str(error))
    report = {"schema": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": _machine(), "reps": reps, "seed": seed,
              "order": "shuffled every round", "skipped": skipped,
              "rows": [_row_dict(r, rows) for r in rows]}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2))
        (out / "report.md").write_text(markdown(report, charts))
        if charts:
            plot(report, out / "latency.png")
            plot_operator_times(report, out / "operators.png")
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
    data["rounds"] = len(row.latency_ms)
    stock = next((r for r in rows if r.model == row.model and r.variant == STOCK), None)
    data["ratio_to_stock"] = (row.median_ms / stock.median_ms
                              if stock and stock.median_ms and row.median_ms else None)
    del data["latency_ms"]
    return data


def rounds_line(report: dict) -> str:
    return (f"{report['reps']} rounds after 3 warm-up runs; every round runs each variant once, "
            f"in an order shuffled anew (seed {report['seed']}); latency = median (min-max) "
            "over the rounds")


def _number(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(report: dict, fmt: str = "simple") -> str:
    headers = ["model", "variant", "GEMMs outside", "delegate calls", "ops outside",
               ".pte bytes", "outputs vs eager", "lower s", "peak RSS MiB",
               "latency ms median (min-max)", "vs stock"]
    body = []
    for r in report["rows"]:
        if r["error"]:
            body.append([r["model"], r["variant"], "", "", "", "", "", "", "",
                         f"failed: {r['error']}", ""])
            continue
        latency = (f"{r['median_ms']:.3f} ({r['min_ms']:.3f}-{r['max_ms']:.3f})"
                   if r["median_ms"] is not None else "")
        body.append([r["model"], r["variant"], r["gemms_outside"], r["delegate_calls"],
                     r["ops_outside"], f"{r['pte_bytes']:,}", outputs_cell(r),
                     _number(r["lower_seconds"], ".2f"), _number(r["peak_rss_mib"], ",.0f"),
                     latency, _number(r["ratio_to_stock"], ".3f")])
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def outputs_cell(row: dict) -> str:
    """The max abs diff where the outputs match eager, else WRONG and why: a wrong .pte never
    shows as a small number."""
    if row.get("outputs_ok") is False:
        return f"WRONG: {row['mismatch']}"
    return f"{row['max_abs_diff']:.1e}"


def _by_model(report: dict) -> dict:
    found: dict = {}
    for r in report["rows"]:
        found.setdefault(r["model"], {})[r["variant"]] = r
    return found


def lowering_table(report: dict, fmt: str = "simple") -> str:
    """Lowering seconds and peak RSS of every variant side by side, each variant lowered in a
    process of its own (peak RSS: the process's high-water mark over the lowering, on top of
    its imports, model and export)."""
    present = [v for v in VARIANTS if any(r["variant"] == v for r in report["rows"])]
    body = []
    for name, found in _by_model(report).items():
        cells = [found.get(v) for v in present]
        body.append([name, " / ".join(_number(c and c["lower_seconds"], ".1f") or "-"
                                      for c in cells),
                     " / ".join(_number(c and c["peak_rss_mib"], ",.0f") or "-" for c in cells),
                     " / ".join(_number(c and c["base_rss_mib"], ",.0f") or "-" for c in cells)])
    order = " / ".join(present)
    return tabulate(body, headers=["model", f"lower s ({order})", f"peak RSS MiB ({order})",
                                   "RSS before lowering MiB"],
                    tablefmt=fmt, disable_numparse=True)


def outside_table(report: dict, fmt: str = "simple", top: int = 6) -> str:
    """executorch's get_delegation_info, stock beside xnnfold: ops left outside by op type."""
    body = []
    for name, found in _by_model(report).items():
        for variant in (STOCK, XNNFOLD):
            r = found.get(variant)
            if r is None or r["error"]:
                continue
            ops = r["ops_outside_by_type"]
            listed = ", ".join(f"{op} {n}" for op, n in list(ops.items())[:top])
            more = f", +{len(ops) - top} types" if len(ops) > top else ""
            body.append([name, variant, r["ops_delegated"], r["ops_outside"], listed + more])
    return tabulate(body, headers=["model", "variant", "ops delegated", "ops outside",
                                   "outside, by op type"], tablefmt=fmt, disable_numparse=True)


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
    if not body:
        return ""
    return tabulate(body, headers=["model", "delegate calls xnnfold / ideal",
                                   ".pte bytes xnnfold / ideal", "bytes vs ideal",
                                   "latency xnnfold / ideal"],
                    tablefmt=fmt, disable_numparse=True)


def gemm_table(report: dict, model: str, fmt: str = "simple") -> str:
    """One model's GEMMs in the user's terms, one row per GEMM: module (class) and node, what
    xnnfold did with its operands, and how many GEMMs of that module stock leaves outside
    delegates."""
    found = _by_model(report).get(model, {})
    stock_outside: dict = {}
    for g in (found.get(STOCK) or {}).get("gemms") or []:
        stock_outside[g["module"]] = stock_outside.get(g["module"], 0) + 1
    by_gemm: dict = {}
    for g in (found.get(XNNFOLD) or {}).get("gemms") or []:
        by_gemm.setdefault(g["gemm"], []).append(g)
    body = []
    for gemm, operands in by_gemm.items():
        said = [o["status"] + (f" (rule {o['rule']})" if o["rule"] else "") for o in operands]
        what = said[0] if len(set(said)) == 1 else \
            ", ".join(f"{o['operand']} {s}" for o, s in zip(operands, said))
        module = operands[0]["module"]
        body.append([module or "", gemm, what, stock_outside.get(module, "")])
    if not body:
        return ""
    return tabulate(body, headers=["module (class)", "node", "xnnfold",
                                   "stock: GEMMs of the module outside delegates"],
                    tablefmt=fmt, disable_numparse=True)


def markdown(report: dict, charts: bool = True) -> str:
    skipped = "".join(f"- skipped {name}: {why}\n" for name, why in report["skipped"].items())
    gemms = "".join(f"### {name}\n\n{gemm_table(report, name, 'github')}\n\n"
                    for name in _by_model(report) if gemm_table(report, name))
    latency, operators = ("![latency](latency.png)", "![operators](operators.png)") if charts \
        else ("(charts not drawn: matplotlib is not installed; pip install 'xnnfold[bench]')",) * 2
    return (f"# xnnfold report\n\n{report['date']} · {report['machine']}\n\n"
            f"{rounds_line(report)}\n\n{skipped and skipped + chr(10)}"
            f"{table(report, 'github')}\n\n"
            f"## xnnfold beside the ideal rewrite\n\n"
            f"{ideal_table(report, 'github') or 'no model here has an ideal rewrite'}\n\n"
            f"## Lowering cost (each variant in its own process)\n\n"
            f"{lowering_table(report, 'github')}\n\n"
            f"## Ops left outside delegates (executorch get_delegation_info)\n\n"
            f"{outside_table(report, 'github')}\n\n"
            f"## GEMMs, in the model's terms\n\n{gemms or 'no GEMM' + chr(10) * 2}"
            f"{latency}\n\n"
            f"## Where the time goes (ETDump, ms per run)\n\n{operators}\n")


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in report["rows"]))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in report["rows"])]
    if not names:                 # every model skipped: no chart
        return
    width = 0.8 / max(1, len(variants))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4))
    for index, variant in enumerate(variants):
        values = [next((r["median_ms"] for r in report["rows"] if r["model"] == name
                        and r["variant"] == variant and r["median_ms"]), 0) for name in names]
        wrong = any(r["variant"] == variant and r["outputs_ok"] is False
                    for r in report["rows"])
        label = f"{variant} (wrong outputs)" if wrong and variant != STOCK else variant
        ax.bar([i + index * width for i in range(len(names))], values, width, label=label,
               hatch="//" if wrong and variant != STOCK else None)
    ax.set_yscale("log")
    ax.set_ylabel("latency, ms (median, log scale)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8, ncol=len(variants), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.set_title("ExecuTorch runtime latency: stock vs xnnfold vs ideal", pad=24)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_operator_times(report: dict, path: Path, top: int = 5) -> None:
    """Per model, stock and xnnfold as stacked bars: ms per run in XNNPACK delegate calls and
    in each of the ``top`` slowest portable ops (the rest summed), from the ETDump."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .devtools import DELEGATE

    profiled = [(name, [found[v] for v in PROFILED if v in found and found[v]["op_ms"]
                        and "failed" not in found[v]["op_ms"]])
                for name, found in _by_model(report).items()]
    profiled = [(name, rows) for name, rows in profiled if rows]
    if not profiled:
        return
    fig, axes = plt.subplots(len(profiled), 1, figsize=(8, 1.3 + 1.1 * len(profiled)),
                             squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (name, rows) in zip(axes[:, 0], profiled):
        portable: dict = {}
        for r in rows:
            for op, ms in r["op_ms"].items():
                if op != DELEGATE:
                    portable[op] = portable.get(op, 0.0) + ms
        shown = [DELEGATE] + sorted(portable, key=lambda op: -portable[op])[:top]
        widest = 0.0
        for y, r in enumerate(rows):
            left = 0.0
            for index, op in enumerate(shown + ["other portable ops"]):
                ms = (r["op_ms"].get(op, 0.0) if op != "other portable ops" else
                      sum(v for k, v in r["op_ms"].items() if k not in shown))
                ax.barh(y, ms, left=left, color=colors[index % 10],
                        label=op if y == 0 else None)
                left += ms
            ax.text(left, y, f" {left:.2f} ms", va="center", fontsize=7)
            widest = max(widest, left)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["variant"] for r in rows], fontsize=8)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, widest * 3)           # room for the total's label
        ax.set_title(name, fontsize=9, loc="left")
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    axes[-1, 0].set_xlabel("ms per run (ETDump, median of 5 runs; symlog scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
