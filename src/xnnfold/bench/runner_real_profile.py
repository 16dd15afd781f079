"""Where a decode step's time goes (``xnnfold bench llm-runner --folder --profile``): one
decode step of each kept .pte (xnnfold's, ``--llm-kernels``' and optimum-executorch's), at
position ``--prompt + --new / 2`` (the middle of the timed decode), at each thread count, timed
by part from the runtime's ETDump (:func:`xnnfold.pte.devtools.operator_profile`): the XNNPACK
delegate calls together, with their count, and each op outside them (portable kernels,
executorch's ``llama::`` kernels). Rows go to ``KEEP/profile.jsonl``, the table to
``KEEP/profile.md``.

The step is the program's ``forward`` on one token at that position, run again and again: the
cache rows it reads are the ones a generation at that position reads (their values do not
change the time), each program's own thread count set before it is loaded, as for the timing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..pte.devtools import DELEGATE
from .runner_real_table import KINDS, NAMES, TOOLS

RUNS = 20                         # steps timed after one warm-up (medians per part)


def step_inputs(position: int) -> tuple:
    """One token at ``position``: ``forward``'s (tokens ``[1, 1]``, positions ``[1]``), as
    executorch's runner calls a decode step of xnnfold's and optimum's .pte."""
    import torch

    return torch.tensor([[7]], dtype=torch.long), torch.tensor([position], dtype=torch.long)


def profile(model: str, precision: str, threads: int, made: dict, args) -> list:
    """One row per .pte of ``made`` (``{tool: Export}``): ``{part: [ms, calls]}`` of one step,
    appended to ``KEEP/profile.jsonl``."""
    from ..export.llm.runtime import set_threads
    from ..pte.devtools import operator_profile

    set_threads(threads)                     # before the program is loaded, as measure does
    position = args.prompt + args.new // 2
    rows = []
    for tool, export in made.items():
        if tool == "llama.cpp" or export.path is None:
            continue
        parts = operator_profile(export.path.read_bytes(), step_inputs(position), runs=RUNS)
        rows.append({"model": model, "precision": precision, "tool": tool, "threads": threads,
                     "position": position, "runs": RUNS,
                     "parts": {name: [ms, calls] for name, (ms, calls) in parts.items()}})
        print(f"profile {model} {precision} {tool} {threads} thread(s): " + "; ".join(
            f"{name} {ms:.3f} ms ({calls})" for name, (ms, calls) in list(parts.items())[:4]),
            flush=True)
    with open(Path(args.keep) / "profile.jsonl", "a") as results:
        for row in rows:
            results.write(json.dumps(row) + "\n")
    return rows


def _cell(row: dict, part: str) -> str:
    if part not in row["parts"]:
        return "—"
    ms, calls = row["parts"][part]
    return f"{ms:.3f} ({calls})"


def table(rows: list) -> str:
    """One table per model and precision: a column per tool and thread count, a line per
    part (the delegate calls first, then the others by their largest time), ms per step and
    (calls per step), and the parts' sum."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["model"], row["precision"]), []).append(row)
    out = []
    for (model, precision), group in groups.items():
        group.sort(key=lambda r: (TOOLS.index(r["tool"]), r["threads"]))
        names = {part for row in group for part in row["parts"]}
        others = sorted(names - {DELEGATE},
                        key=lambda p: -max(r["parts"].get(p, [0.0])[0] for r in group))
        heads = " | ".join(f"{NAMES.get(r['tool'], r['tool'])}, {r['threads']} thread"
                           f"{'s' * (r['threads'] > 1)}" for r in group)
        out += [f"{model}, {KINDS.get(precision, precision)}: one decode step at position "
                f"{group[0]['position']}, ms per step (calls per step), medians of "
                f"{group[0]['runs']} steps after one warm-up (ETDump)", "",
                f"| part | {heads} |", "|---|" + "---|" * len(group)]
        for part in [DELEGATE] * (DELEGATE in names) + others:
            label = "XNNPACK delegate calls" if part == DELEGATE else f"`{part}`"
            out.append(f"| {label} | " + " | ".join(_cell(r, part) for r in group) + " |")
        sums = " | ".join(f"{sum(ms for ms, _ in r['parts'].values()):.3f}" for r in group)
        out += [f"| sum of the parts | {sums} |", ""]
    return "\n".join(out).rstrip("\n")
