"""The report's charts: latency per variant, and where the time goes (ETDump), drawn with
matplotlib (the ``bench`` extra) from the report's dict.

One panel per model, horizontal bars on a linear axis of its own (models differ by orders of
magnitude; a shared or log axis makes the fast variants slivers), every bar labelled with its
value: the figures are the latency table's (the median over the interleaved rounds), never
numbers of their own.
"""

from __future__ import annotations

from pathlib import Path

from .tables import PROFILED, VARIANTS, _by_model, ms, operator_split
from ..pte.variants import STOCK


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _label(row: dict, stock: dict) -> str:
    text = f" {ms(row['median_ms'])} ms"
    if stock is not None and stock is not row and stock.get("median_ms"):
        text += f" · {row['median_ms'] / stock['median_ms']:.3g}x stock"
    if row["outputs_ok"] is False:
        text += " · WRONG outputs"
    return text


def plot(report: dict, path: Path) -> bool:
    """latency.png: per model, each variant's median latency; False (nothing drawn) when no
    variant has one."""
    models = {name: found for name, found in _by_model(report).items()
              if any(r["median_ms"] for r in found.values())}
    if not models:
        return False
    plt = _pyplot()
    colors = plt.get_cmap("tab10").colors
    present = [v for v in VARIANTS if any(v in found for found in models.values())]
    fig, axes = plt.subplots(len(models), 1, squeeze=False,
                             figsize=(8, 1.0 + sum(0.32 * len(f) + 0.5 for f in models.values())),
                             height_ratios=[len(f) for f in models.values()])
    for ax, (name, found) in zip(axes[:, 0], models.items()):
        rows = [found[v] for v in VARIANTS if v in found]
        widest = max(r["median_ms"] or 0 for r in rows)
        for y, r in enumerate(rows):
            if not r["median_ms"]:
                ax.text(0, y, " failed" if r["error"] else " not timed", va="center",
                        fontsize=7, color="dimgray")
                continue
            ax.barh(y, r["median_ms"], color=colors[VARIANTS.index(r["variant"]) % 10],
                    hatch="//" if r["outputs_ok"] is False else None)
            ax.text(r["median_ms"], y, _label(r, found.get(STOCK)), va="center", fontsize=7)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["variant"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, widest * 1.6)           # room for the labels
        ax.set_title(name, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1, 0].set_xlabel("ms per run, median over the interleaved rounds", fontsize=8)
    fig.suptitle(f"ExecuTorch runtime latency: {' vs '.join(present)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_operator_times(report: dict, path: Path, top: int = 5) -> bool:
    """operators.png: per model, stock and xnnfold as stacked bars, the median latency split in
    the ETDump's shares (:func:`xnnfold.bench.tables.operator_split`); False when no variant
    was profiled."""
    splits = []
    for name, found in _by_model(report).items():
        categories, split = operator_split([found[v] for v in PROFILED if v in found], top)
        if split:
            splits.append((name, categories, split))
    if not splits:
        return False
    plt = _pyplot()
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(len(splits), 1, figsize=(8, 1.3 + 1.1 * len(splits)),
                             squeeze=False)
    for ax, (name, categories, split) in zip(axes[:, 0], splits):
        for y, (variant, values) in enumerate(split.items()):
            left = 0.0
            for index, (category, part) in enumerate(zip(categories, values)):
                ax.barh(y, part, left=left, color=colors[index % 10],
                        label=category if y == 0 else None)
                left += part
            ax.text(left, y, f" {ms(left)} ms", va="center", fontsize=7)
        ax.set_yticks(range(len(split)))
        ax.set_yticklabels(list(split), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(sum(v) for v in split.values()) * 1.25)
        ax.set_title(name, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    axes[-1, 0].set_xlabel("ms per run: the median latency (as in the table), split in the "
                           "shares of an ETDump", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
