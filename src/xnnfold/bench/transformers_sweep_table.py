"""``sweep.md`` from ``sweep.csv`` (:mod:`.transformers_sweep`): the totals, the classes xnnfold
speeds up most, every class where it gains nothing, loses or fails against stock or stock's
``force_non_static_weights_for_f32_linear`` flag (with the row's reasons), and the whole
table."""

from __future__ import annotations

import csv
import os
import platform
import time
from pathlib import Path

# A ratio (xnnfold / stock median, or / the flag's) within this of 1 is no gain: the timing's
# noise on tiny models under a shared machine's load.
NO_GAIN = 0.97
SLOWER = 1.03                   # beyond the noise
TOP = 15
# the baselines xnnfold must not be behind: their ratio column, how a reason names them
BASELINES = {"stock": ("ratio", "stock"), "stock_flag": ("ratio_flag", "the flag's")}


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _exports(row, variant) -> bool:
    return row.get(f"{variant}_export") == "yes"


def _wrong(row, variant) -> bool:
    """Its .pte's outputs are wrong, or it does not run."""
    return str(row.get(f"{variant}_verdict", "")).startswith(("WRONG", "does not run"))


def losses(row) -> list:
    """Why a row is not a gain for xnnfold: each axis where it is worse than stock or no
    better (an empty list: a gain)."""
    why = []
    if row.get("error"):
        why.append(row["error"])
    if not any(_exports(row, variant) for variant in ("stock", "stock_flag", "xnnfold")):
        return why + ([row["xnnfold_export"]] if row.get("xnnfold_export") else [])
    if any(_exports(row, b) for b in BASELINES) and not _exports(row, "xnnfold"):
        why.append(f"xnnfold: {row.get('xnnfold_export') or 'no result'}")
    for variant in ("stock", "stock_flag", "xnnfold"):
        if _wrong(row, variant):
            why.append(f"{variant} {row[f'{variant}_verdict']}")
    for baseline, (column, whose) in BASELINES.items():
        ratio = _float(row.get(column))
        if ratio is not None and ratio >= NO_GAIN:
            why.append(f"{column} {ratio:.2f}")
        sizes = _float(row.get("xnnfold_bytes")), _float(row.get(f"{baseline}_bytes"))
        if _larger(row, "xnnfold", baseline):
            why.append(f".pte {int(sizes[0] - sizes[1]):,} bytes larger than {whose}")
    if _float(row.get("ratio")) is not None and row.get("rewritten") in ("[{}]", "[]"):
        why.append("the pass rewrote nothing")
    return why


def _slower(row, variant, than) -> bool:
    """``variant``'s median beyond the noise above ``than``'s."""
    times = _float(row.get(f"{variant}_ms")), _float(row.get(f"{than}_ms"))
    return None not in times and times[1] > 0 and times[0] / times[1] > SLOWER


def _larger(row, variant, than) -> bool:
    """``variant``'s .pte larger than ``than``'s, a .pte that runs and is right (one that does
    not is no baseline)."""
    sizes = _float(row.get(f"{variant}_bytes")), _float(row.get(f"{than}_bytes"))
    return None not in sizes and sizes[0] > sizes[1] and not _wrong(row, than)


def _cells(row) -> list:
    def each(column, fmt="{}"):
        values = [row.get(f"{v}_{column}", "") for v in ("stock", "stock_flag", "xnnfold")]
        return " / ".join(fmt.format(_float(v)) if _float(v) is not None else "-" for v in values)

    return [row["class"], row.get("ratio") or "-", row.get("ratio_flag") or "-",
            each("calls", "{:.0f}"), each("outside", "{:.0f}"),
            each("portable_share", "{:.0%}"), each("bytes", "{:,.0f}"), each("ms", "{:.3f}")]


HEADER = ["class", "xnnfold / stock", "xnnfold / stock flag",
          "delegate calls (stock / flag / xnnfold)", "ops outside delegates",
          "portable share of time", ".pte bytes", "median ms"]


def _table(rows, header=HEADER, cells=_cells) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells(row)) + " |"
              for row in rows]
    return lines


def totals(rows: list) -> list:
    """The summary's lines: exports and wrong per variant; xnnfold against stock and against
    the flag (slower beyond the noise, no faster, larger); the flag against stock and
    xnnfold."""
    built = [r for r in rows if not str(r.get("error", "")).startswith("not built")]
    count = lambda test: sum(1 for r in built if test(r))  # noqa: E731
    lines = [f"{len(rows)} classes, {len(built)} built at tiny dims. Exports / wrong or not "
             "running: " + ", ".join(
        f"{v} {count(lambda r: _exports(r, v))} / {count(lambda r: _wrong(r, v))}"
        for v in ("stock", "stock_flag", "xnnfold")) + "."]
    for baseline, (column, _) in BASELINES.items():
        timed = [r for r in built if _float(r.get(column)) is not None]
        lines.append(
            f"xnnfold against {baseline} ({len(timed)} timed): slower (> {SLOWER}) "
            f"{sum(_slower(r, 'xnnfold', baseline) for r in timed)}, no faster (>= {NO_GAIN}) "
            f"{sum(_float(r[column]) >= NO_GAIN for r in timed)}, .pte larger "
            f"{count(lambda r: _larger(r, 'xnnfold', baseline))}.")
    flagged = [r for r in built if _float(r.get("stock_flag_ms")) is not None]
    lines.append(
        f"stock_flag ({len(flagged)} timed): slower than stock "
        f"{sum(_slower(r, 'stock_flag', 'stock') for r in flagged)}, than xnnfold "
        f"{sum(_slower(r, 'stock_flag', 'xnnfold') for r in flagged)}; faster than stock "
        f"{sum(_slower(r, 'stock', 'stock_flag') for r in flagged)}; .pte larger than "
        f"stock's {count(lambda r: _larger(r, 'stock_flag', 'stock'))}, smaller "
        f"{count(lambda r: _larger(r, 'stock', 'stock_flag'))}.")
    return lines


def write_markdown(table: Path, markdown: Path) -> None:
    from importlib.metadata import version

    import torch
    import transformers

    with open(table, newline="") as file:
        rows = list(csv.DictReader(file))
    timed = sorted((r for r in rows if _float(r.get("ratio")) is not None and
                    _exports(r, "stock") and _exports(r, "xnnfold")),
                   key=lambda r: _float(r["ratio"]))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# transformers' exporter: stock, stock's flag and xnnfold",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; transformers "
        f"{transformers.__version__}, executorch {version('executorch')}, "
        f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, load "
        f"average {load} when written. stock_flag: stock's partitioner with "
        "force_non_static_weights_for_f32_linear=True.",
        "",
        *("- " + line for line in totals(rows)),
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
