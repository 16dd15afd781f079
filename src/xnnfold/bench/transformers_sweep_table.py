"""``sweep.md`` from ``sweep.csv`` (:mod:`.transformers_sweep`): the totals, the classes xnnfold
speeds up most, every class where it gains nothing, loses or fails (with the row's reasons),
and the whole table."""

from __future__ import annotations

import csv
import os
import platform
import time
from pathlib import Path

# A ratio (xnnfold / stock median) within this of 1 is no gain: the timing's noise on tiny
# models under a shared machine's load.
NO_GAIN = 0.97
TOP = 15


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _exports(row, variant) -> bool:
    return row.get(f"{variant}_export") == "yes"


def _wrong(row, variant) -> bool:
    return str(row.get(f"{variant}_verdict", "")).startswith("WRONG")


def losses(row) -> list:
    """Why a row is not a gain for xnnfold: each axis where it is worse than stock or no
    better (an empty list: a gain)."""
    why = []
    if row.get("error"):
        why.append(row["error"])
    if not _exports(row, "stock") and not _exports(row, "xnnfold"):
        return why + ([row["xnnfold_export"]] if row.get("xnnfold_export") else [])
    if _exports(row, "stock") and not _exports(row, "xnnfold"):
        why.append(f"xnnfold: {row.get('xnnfold_export') or 'no result'}")
    for variant in ("stock", "xnnfold"):
        if _wrong(row, variant):
            why.append(f"{variant} {row[f'{variant}_verdict']}")
    ratio = _float(row.get("ratio"))
    if ratio is not None and ratio >= NO_GAIN:
        why.append(f"ratio {ratio:.2f}")
    sizes = _float(row.get("xnnfold_bytes")), _float(row.get("stock_bytes"))
    if None not in sizes and sizes[0] > sizes[1]:
        why.append(f".pte {int(sizes[0] - sizes[1]):,} bytes larger")
    if ratio is not None and row.get("rewritten") in ("[{}]", "[]"):
        why.append("the pass rewrote nothing")
    return why


def _cells(row) -> list:
    def pair(column, fmt="{}"):
        values = [row.get(f"{v}_{column}", "") for v in ("stock", "xnnfold")]
        return " / ".join(fmt.format(_float(v)) if _float(v) is not None else "-" for v in values)

    return [row["class"], row.get("ratio") or "-", pair("calls", "{:.0f}"),
            pair("outside", "{:.0f}"), pair("portable_share", "{:.0%}"),
            pair("bytes", "{:,.0f}"), pair("ms", "{:.3f}")]


HEADER = ["class", "xnnfold / stock", "delegate calls", "ops outside delegates",
          "portable share of time", ".pte bytes", "median ms"]


def _table(rows, header=HEADER, cells=_cells) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells(row)) + " |"
              for row in rows]
    return lines


def write_markdown(table: Path, markdown: Path) -> None:
    from importlib.metadata import version

    import torch
    import transformers

    with open(table, newline="") as file:
        rows = list(csv.DictReader(file))
    built = [r for r in rows if not str(r.get("error", "")).startswith("not built")]
    both = [r for r in built if _exports(r, "stock") and _exports(r, "xnnfold")]
    timed = sorted((r for r in both if _float(r.get("ratio")) is not None),
                   key=lambda r: _float(r["ratio"]))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# transformers' exporter: stock against xnnfold",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; transformers "
        f"{transformers.__version__}, executorch {version('executorch')}, "
        f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, load "
        f"average {load} when written.",
        "",
        f"{len(rows)} classes: {len(built)} built at tiny dims; stock exports "
        f"{sum(_exports(r, 'stock') for r in built)}, xnnfold "
        f"{sum(_exports(r, 'xnnfold') for r in built)}; wrong: stock "
        f"{sum(_wrong(r, 'stock') for r in built)}, xnnfold "
        f"{sum(_wrong(r, 'xnnfold') for r in built)}; xnnfold slower (ratio > 1.03): "
        f"{sum(_float(r['ratio']) > 1.03 for r in timed)}, no faster (ratio >= {NO_GAIN}): "
        f"{sum(_float(r['ratio']) >= NO_GAIN for r in timed)}, .pte larger: "
        f"{sum(int(r['xnnfold_bytes']) > int(r['stock_bytes']) for r in both)}.",
        "",
        f"## The {TOP} largest speed-ups",
        "",
        *_table(timed[:TOP]),
        "",
        "## Where xnnfold gains nothing, loses or fails",
        "",
        *_table([r for r in rows if losses(r)], ["class", "why"],
                lambda r: [r["class"], "; ".join(losses(r))]),
        "",
        "## Every class",
        "",
        *_table(rows),
        "",
    ]
    markdown.write_text("\n".join(lines))
