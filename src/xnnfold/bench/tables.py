"""The report's tables (plain text for the terminal, GitHub markdown for report.md), read
from the report's JSON-able dict (:func:`xnnfold.bench.report.run_report`)."""

from __future__ import annotations

from tabulate import tabulate

from .isolated import EAGER_EXPORT, IDEAL
from .measure import CONSTANT_PROP, STOCK, STOCK_FLAG, XNNFOLD, XNNFOLD_SIZE

# The variants in the order the report shows them.
VARIANTS = (STOCK, XNNFOLD, XNNFOLD_SIZE, STOCK_FLAG, IDEAL, EAGER_EXPORT, CONSTANT_PROP)
PROFILED = (STOCK, XNNFOLD)          # the variants whose time the ETDump breaks down


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


def portable_table(report: dict, fmt: str = "simple") -> str:
    """Where a run's time goes, from the ETDump of each profiled variant: the total, what runs
    on portable kernels (its share of the run) and the portable ops that take the most."""
    from .devtools import DELEGATE

    body = []
    for r in report["rows"]:
        ops = r.get("op_ms") or {}
        if not ops or "failed" in ops:
            continue
        total = sum(ops.values())
        portable = total - ops.get(DELEGATE, 0.0)
        top = ", ".join(f"{name} {ms:.3f}" for name, ms in ops.items() if name != DELEGATE)
        body.append([r["model"], r["variant"], f"{total:.3f}",
                     f"{portable:.3f} ({100 * portable / total if total else 0:.1f}%)",
                     top[:120]])
    if not body:
        return ""
    return tabulate(body, headers=["model", "variant", "ETDump ms per run", "portable ms (share)",
                                   "top portable ops (ms)"],
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
            f"## Where the time goes (ETDump, ms per run)\n\n{operators}\n\n"
            f"{portable_table(report, 'github')}\n")
