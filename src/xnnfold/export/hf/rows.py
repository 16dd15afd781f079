"""What ``xnnfold hf`` writes and measures: the .pte paths of a model's parts, one row per
part and variant, the table it prints, and the one-line error of a step that fails.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...usage import OptionError, UsageError, first_line


def pte_path(output: Path, part: str) -> Path:
    return output if not part else output.with_suffix(f".{part}{output.suffix}")


def table(rows: list) -> str:
    """The rows as a table; where a row's .pte has a .ptd beside it (``ptd_bytes``, counted in
    ``pte_bytes``), its bytes read .pte + .ptd, and the column's header says so."""
    from tabulate import tabulate

    def size(r) -> str:
        ptd = r.get("ptd_bytes", 0)
        return f"{r['pte_bytes']:,}" if not ptd else \
            f"{r['pte_bytes']:,} ({r['pte_bytes'] - ptd:,} + {ptd:,})"

    body = [[r["part"], r["variant"], r["gemms_outside"], r["delegate_calls"],
             size(r), r["outputs"], f"{r['lower_seconds']:.1f}",
             "" if r["median_ms"] is None else f"{r['median_ms']:.3f}",
             "" if r["vs_stock"] is None else f"{r['vs_stock']:.3f}", r["written"]]
            for r in rows]
    bytes_header = ".pte + .ptd bytes" if any(r.get("ptd_bytes") for r in rows) else \
        ".pte bytes"
    return tabulate(body, headers=["part", "variant", "GEMMs outside", "delegate calls",
                                   bytes_header, "outputs vs eager", "lower s",
                                   "latency ms (median)", "vs stock", "written"],
                    disable_numparse=True)


@dataclass
class Exported:
    """What :func:`export_folder` wrote and measured."""

    rows: list                 # one per part (or method) and variant: see table()
    notes: list                # lines to print after the table
    wrong: list                # one line per .pte whose outputs differ from eager


@contextlib.contextmanager
def failing_as_usage(what: str):
    """A model transformers has but torch.export or the lowering cannot take: one line
    naming the step and the error (``--debug`` shows the traceback), not a traceback."""
    try:
        yield
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever fails, say which step and why
        from ..llm.export import CannotExport

        said = error.reason if isinstance(error, CannotExport) else first_line(error, 200)
        if "`" in what:        # it names options: the error's own words stay as they are
            raise OptionError(f"{what} failed ({said.replace('`', chr(39))})") from error
        raise UsageError(f"{what} failed ({said})") from error


def row(part: str, variant: str, lowered, verdict, median_ms, written: str,
        gemms_outside: Optional[int] = None, delegate_calls: Optional[int] = None) -> dict:
    """One row of the table (a Lowered's counts unless given)."""
    return {"part": part, "variant": variant,
            "gemms_outside": len(lowered.gemms_outside) if gemms_outside is None
            else gemms_outside,
            "delegate_calls": lowered.delegate_calls if delegate_calls is None
            else delegate_calls,
            "pte_bytes": lowered.pte_bytes, "outputs": "not checked" if verdict is None
            else str(verdict), "lower_seconds": lowered.lower_seconds, "median_ms": median_ms,
            "written": written}


def ratios(rows: list) -> None:
    """Each row's latency as a ratio of its part's stock row (``vs_stock``)."""
    for r in rows:
        stock = next((s for s in rows if s["part"] == r["part"] and s["variant"] == "stock"),
                     None)
        r["vs_stock"] = (r["median_ms"] / stock["median_ms"]
                         if stock and stock["median_ms"] and r["median_ms"] else None)
