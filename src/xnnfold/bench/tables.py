"""The report's tables (plain text for the terminal, GitHub markdown for report.md), read
from the report's JSON-able dict (:func:`xnnfold.bench.report.run_report`)."""

from __future__ import annotations

import math

from tabulate import tabulate

from ..pte.variants import IDEAL, PROFILED, STOCK, STOCK_FLAG, VARIANTS, XNNFOLD  # noqa: F401


def rounds_line(report: dict) -> str:
    return (f"{report['reps']} rounds after 3 warm-up runs; every round runs each variant once, "
            f"in an order shuffled anew (seed {report['seed']}); latency = median (min-max) "
            "over the rounds")


def ms(value: float) -> str:
    """A latency in ms to three significant digits, without an exponent (159, 1.44, 0.0452):
    the one format of the tables and the charts."""
    if not value or not math.isfinite(value):
        return format(value or 0.0, "g")
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def _number(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(report: dict, fmt: str = "simple") -> str:
    headers = ["model", "variant", "GEMMs outside", "delegate calls", "ops outside",
               ".pte bytes", "outputs vs eager", "lower s", "peak RSS MiB",
               "latency ms median (min-max)", "vs stock"]
    body, errors = [], {}
    for r in report["rows"]:
        if r["error"]:
            number = errors.setdefault(r["error"], len(errors) + 1)
            body.append([r["model"], r["variant"], "", "", "", "", "", "", "",
                         f"failed [{number}]", ""])
            continue
        latency = (f"{ms(r['median_ms'])} ({ms(r['min_ms'])}-{ms(r['max_ms'])})"
                   if r["median_ms"] is not None else "")
        body.append([r["model"], r["variant"], r["gemms_outside"], r["delegate_calls"],
                     r["ops_outside"], f"{r['pte_bytes']:,}", outputs_cell(r),
                     _number(r["lower_seconds"], ".2f"), _number(r["peak_rss_mib"], ",.0f"),
                     latency, _number(r["ratio_to_stock"], ".3f")])
    notes = "".join(f"\n[{number}] {error}" for error, number in errors.items())
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True) + \
        ("\n" + notes.replace("\n", "\n\n" if fmt == "github" else "\n") if notes else "")


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
    """executorch's get_delegation_info, every variant side by side: ops left outside by op
    type."""
    body = []
    for name, found in _by_model(report).items():
        for variant in VARIANTS:
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


OTHER_PORTABLE = "other portable ops"


def operator_split(rows: list, top: int = 5) -> tuple:
    """Where the time of one model's profiled variants goes: ``(categories, {variant: [ms,
    ...]})``, the categories being XNNPACK delegate calls, the ``top`` slowest portable ops
    over these rows, and the other portable ops summed. Each variant's ms add up to its
    median latency, the latency table's; the ETDump gives the shares only. (Its own times are
    of a separate, instrumented pass of 5 runs: XNNPACK then profiles each of its operators,
    which makes a small model's run slower; on a loaded machine 5 runs can be far from the
    interleaved median. One number per variant, the table's, and the ETDump's proportions.)"""
    from ..pte.devtools import DELEGATE

    usable = [r for r in rows if r["median_ms"] and r["op_ms"] and "failed" not in r["op_ms"]
              and sum(r["op_ms"].values()) > 0]
    portable: dict = {}
    for r in usable:
        for op, ms in r["op_ms"].items():
            if op != DELEGATE:
                portable[op] = portable.get(op, 0.0) + ms / sum(r["op_ms"].values())
    categories = [DELEGATE] + sorted(portable, key=lambda op: -portable[op])[:top]
    split = {}
    for r in usable:
        profiled = sum(r["op_ms"].values())
        shares = [r["op_ms"].get(op, 0.0) for op in categories]
        shares.append(profiled - sum(shares))
        split[r["variant"]] = [r["median_ms"] * share / profiled for share in shares]
    return categories + [OTHER_PORTABLE], split


def operator_table(report: dict, fmt: str = "simple") -> str:
    """:func:`operator_split` of each model's profiled variants, as the chart draws it."""
    body = []
    for name, found in _by_model(report).items():
        categories, split = operator_split([found[v] for v in PROFILED if v in found])
        for variant, values in split.items():
            total = sum(values)
            parts = ", ".join(f"{op} {ms(part)}" for op, part in zip(categories, values)
                              if part >= 0.001 * total)
            # categories[0] is the delegate: the rest is what portable kernels take
            portable = f"{100 * (1 - values[0] / total):.1f}%" if total else "-"
            body.append([name, variant, ms(total), portable, parts])
    if not body:
        return ""
    return tabulate(body, headers=["model", "variant", "latency ms (median)", "on portable",
                                   "ms by XNNPACK delegate / portable op (ETDump shares)"],
                    tablefmt=fmt, disable_numparse=True)


_NOT_DRAWN = "(charts not drawn: matplotlib is not installed; pip install 'xnnfold[bench]')"


def markdown(report: dict, drawn=("latency.png", "operators.png")) -> str:
    """report.md; ``drawn``: the charts written beside it (None: matplotlib is missing)."""
    skipped = "".join(f"- skipped {name}: {why}\n" for name, why in report["skipped"].items())
    gemms = "".join(f"### {name}\n\n{gemm_table(report, name, 'github')}\n\n"
                    for name in _by_model(report) if gemm_table(report, name))
    ideal = ideal_table(report, "github")
    operators = operator_table(report, "github")
    sections = [f"# xnnfold report\n\n{report['date']} · {report['machine']}\n\n"
                f"{rounds_line(report)}\n\n{skipped and skipped + chr(10)}"
                f"{table(report, 'github')}\n\n"]
    if drawn is None or "latency.png" in drawn:
        sections.append(f"{_NOT_DRAWN if drawn is None else '![latency](latency.png)'}\n\n")
    if ideal:
        sections.append(f"## xnnfold beside the ideal rewrite\n\n{ideal}\n\n")
    sections += [f"## Lowering cost (each variant in its own process)\n\n"
                 f"{lowering_table(report, 'github')}\n\n",
                 f"## Ops left outside delegates (executorch get_delegation_info)\n\n"
                 f"{outside_table(report, 'github')}\n\n",
                 f"## GEMMs, in the model's terms\n\n{gemms or 'no GEMM' + chr(10) * 2}"]
    if operators:
        chart = _NOT_DRAWN if drawn is None else \
            "![operators](operators.png)" if "operators.png" in drawn else ""
        sections.append(f"## Where the time goes (ms per run: the median latency, split in "
                        f"the shares of an ETDump)\n\n{operators}\n\n{chart}\n")
    return "".join(sections)
