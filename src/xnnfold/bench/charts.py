"""The report's charts: latency per variant, and where the time goes (ETDump), drawn with
matplotlib (the ``bench`` extra) from the report's dict."""

from __future__ import annotations

from pathlib import Path

from .measure import STOCK
from .tables import PROFILED, VARIANTS, _by_model


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
