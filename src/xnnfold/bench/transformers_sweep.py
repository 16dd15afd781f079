"""transformers' exporter, stock against stock with its flag against xnnfold, over the model
classes transformers' auto mappings build at tiny dims (:mod:`.tiny_models`): what ``xnnfold
bench transformers-sweep`` writes.

Each class is measured in a process of its own (:func:`.transformers_sweep_measure.measure`),
forked from a forkserver that has imported torch, transformers and executorch and exported a
tiny model once (:mod:`.transformers_sweep_warm`), and stopped after a timeout. The parent keeps
one row per class in ``sweep.csv`` (a class already there is skipped: the sweep resumes; with
``redo_missing_variant``, a row from before a variant was measured, the stock flag's, is
measured again and replaced) and rewrites ``sweep.md``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path

from .transformers_sweep_measure import PER_VARIANT, RATIOS, VARIANTS

FIELDS = ("class", "model_type", "error", *(f"{v}_{c}" for v in VARIANTS for c in PER_VARIANT),
          *RATIOS, "rewritten", "xnnfold_warning")
PRELOAD = ["xnnfold.bench.transformers_sweep_warm"]


def read_rows(table: Path) -> list:
    if not table.exists():
        return []
    with open(table, newline="") as file:
        return list(csv.DictReader(file))


def write_rows(table: Path, rows: list) -> None:
    """The whole table, in :data:`FIELDS` (a column an older table lacks is empty), replaced
    at once: an interrupted write leaves the previous table."""
    partial = table.with_suffix(".csv.partial")
    with open(partial, "w", newline="") as file:
        writer = csv.DictWriter(file, FIELDS, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, table)


def lacks_a_variant(row: dict) -> bool:
    """A row without a variant's export column (measured before the variant was, or cut short
    by an earlier variant's failure), but for a class the sweep could not build."""
    return not str(row.get("error") or "").startswith("not built") and not all(
        row.get(f"{variant}_export") for variant in VARIANTS)


def _exported(row: dict) -> int:
    """How many variants exported in ``row``."""
    return sum(row.get(f"{variant}_export") == "yes" for variant in VARIANTS)


def merge(folder: Path, others: list) -> int:
    """Rows of the sweeps in ``others`` into ``folder``'s table (two sweeps over disjoint
    ``--classes`` in two folders use both cores; each folder's table is rewritten whole by its
    own process, so they cannot share one). A class in both keeps the row with more exports,
    ``folder``'s on a tie (the rule a redo follows). Returns how many rows were added or
    replaced; ``sweep.md`` is written again."""
    from .transformers_sweep_table import write_markdown

    table = folder / "sweep.csv"
    rows = read_rows(table)
    where = {row["class"]: index for index, row in enumerate(rows)}
    changed = 0
    for other in others:
        if not (Path(other) / "sweep.csv").is_file():
            raise FileNotFoundError(f"{other}: no sweep.csv to merge")
        for row in read_rows(Path(other) / "sweep.csv"):
            index = where.get(row["class"])
            if index is None:
                where[row["class"]] = len(rows)
                rows.append(row)
                changed += 1
            elif _exported(row) > _exported(rows[index]):
                rows[index] = row
                changed += 1
    folder.mkdir(parents=True, exist_ok=True)
    write_rows(table, rows)
    write_markdown(table, folder / "sweep.md")
    return changed


def _run_one(class_name: str, model_type: str, folder: Path, timeout: float,
             rounds: int) -> dict:
    import torch

    from ..export.transformers_exporter import _one_line
    from ..pte.child import Child, ChildDied
    from .transformers_sweep_measure import measure_in_child

    result = folder / "rows" / f"{class_name}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    error = None
    try:
        with Child(measure_in_child, class_name, model_type, str(result), rounds,
                   torch.get_num_threads(), preload=PRELOAD) as child:
            child.receive(timeout)
    except TimeoutError:
        error = f"timed out after {timeout:.0f} s"
    except ChildDied as died:
        error = str(died)
    except Exception as failure:  # noqa: BLE001 - the measurement's own failure is the row's
        error = _one_line(failure)
    row = json.loads(result.read_text()) if result.exists() else \
        {"class": class_name, "model_type": model_type}
    if error and not row.get("error"):
        row["error"] = error
    return row


def sweep(folder: Path, pattern: str = "", limit: int = 0, timeout: float = 900,
          rounds: int = 20, echo=print, redo_missing_variant: bool = False) -> list:
    """Measure the classes matching ``pattern`` not yet in ``folder/sweep.csv`` (at most
    ``limit``, 0: all), each in a process of its own; with ``redo_missing_variant``, first the
    rows there that lack a variant (:func:`lacks_a_variant`). Returns the rows written."""
    from .tiny_models import model_classes
    from .transformers_sweep_table import write_markdown

    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "sweep.csv"
    rows = read_rows(table)
    done = {row["class"]: row for row in rows}
    classes = [(c, t) for c, t in model_classes() if re.search(pattern, c)]
    redo = [(c, t) for c, t in classes if c in done and redo_missing_variant
            and lacks_a_variant(done[c])]
    todo = redo + [(c, t) for c, t in classes if c not in done]
    todo = todo[:limit] if limit else todo
    measured = []
    for index, (class_name, model_type) in enumerate(todo, 1):
        start = time.perf_counter()
        row = _run_one(class_name, model_type, folder, timeout, rounds)
        if class_name in done and _exported(row) < _exported(done[class_name]):
            # a redo that got less (a timeout on a loaded machine) keeps the row it had
            echo(f"[{index}/{len(todo)}] {class_name}: measured again, fewer exports "
                 f"({row.get('error') or 'no reason'}): the earlier row kept")
            continue
        if class_name in done:
            rows[next(i for i, r in enumerate(rows) if r["class"] == class_name)] = row
        else:
            rows.append(row)
        done[class_name] = row
        write_rows(table, rows)
        measured.append(row)
        exports = ", ".join(f"{v} {row.get(f'{v}_export', '-')}" for v in VARIANTS)
        ratios = ", ".join(f"{c} {row.get(c, '-')}" for c in RATIOS)
        echo(f"[{index}/{len(todo)}] {class_name}: {exports}; {ratios}"
             f"{'; ' + row['error'] if row.get('error') else ''} "
             f"({time.perf_counter() - start:.0f} s)")
        write_markdown(table, folder / "sweep.md")
    return measured
