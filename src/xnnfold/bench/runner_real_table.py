"""The tables of ``xnnfold bench llm-runner --folder`` (:mod:`xnnfold.bench.runner_real`): speed
per model, precision and thread count, and what each export cost."""

from __future__ import annotations

TOOLS = ("xnnfold", "xnnfold-llm", "optimum", "llama.cpp")
# xnnfold-llm (--xnnfold-kernels ...,llm: its .pte made with --llm-kernels) has its columns
# only in the tables of a run that measured or exported it: other runs' tables are unchanged
NAMES = {"xnnfold-llm": "xnnfold --llm-kernels"}
KINDS = {"fp32": "fp32 (llama.cpp f32)", "8da4w": "8da4w (llama.cpp q4_0)"}


def _ms(row: dict, tool: str, key: str, digits: int) -> str:
    return f"{row[tool][key]:.{digits}f}" if tool in row else "—"


def _ratio(row: dict, tool: str, other: str, key: str) -> str:
    if tool not in row or other not in row or not row[other][key]:
        return "—"
    return f"{row[tool][key] / row[other][key]:.2f}"


def shown(present) -> tuple:
    """The tools with columns: all but xnnfold-llm, which only where ``present`` has it."""
    return tuple(t for t in TOOLS if t != "xnnfold-llm" or t in present)


def _versus(row: dict, tool: str, other: str) -> str:
    return f"{_ratio(row, tool, other, 'prefill_ms')} / {_ratio(row, tool, other, 'decode_ms')}"


def speed_table(rows: list, args) -> str:
    tools = shown({t for row in rows for t in row})
    pairs = [("xnnfold", "optimum")] + [("xnnfold-llm", "optimum")] * ("xnnfold-llm" in tools)
    pairs.append(("xnnfold", "llama.cpp"))
    names = " / ".join(NAMES.get(t, t) for t in tools)
    versus = " | ".join(f"{NAMES.get(t, t)} / {o}, prefill / decode" for t, o in pairs)
    lines = [
        f"Prefill of {args.prompt} tokens and decode per token ({args.new} generated) in ms, "
        f"medians; {names}; ratios xnnfold over the other; the floor: "
        "bytes a decode step reads over the copy bandwidth at that thread count.", "",
        f"| model | precision | threads | prefill | decode | {versus} | floor (copy GB/s) | "
        "decode / floor | load |",
        "|---|---|---|---|---|" + "---|" * len(pairs) + "---|---|---|"]
    for row in rows:
        prefill = " / ".join(_ms(row, t, "prefill_ms", 0) for t in tools)
        decode = " / ".join(_ms(row, t, "decode_ms", 2) for t in tools)
        ratios = " | ".join(_versus(row, t, o) for t, o in pairs)
        floor = " / ".join(f"{row[t]['decode_ms'] / row['floor_ms']:.2f}" if t in row else "—"
                           for t in tools)
        load = f"{row['load'][0]} -> {row['load'][-1]}"
        lines.append(f"| {row['model']} | {KINDS.get(row['precision'], row['precision'])} | "
                     f"{row['threads']} | {prefill} | {decode} | {ratios} | "
                     f"{row['floor_ms']:.2f} ms ({row['copy_GBps']:.1f}) | {floor} | {load} |")
    prompts = {t: sorted({n for r in rows if t in r for n in r[t]["prompt_tokens"]})
               for t in tools}
    lines += ["", "Prompt tokens as each tool counted them: " + "; ".join(
        f"{t} {p}" for t, p in prompts.items() if p) + "."]
    return "\n".join(lines)


def _size(value) -> str:
    return f"{value:,}" if value is not None else "—"


def _cost(export) -> str:
    if export is None or export.path is None and not export.error:
        return "—"
    if export.error:
        return f"failed: {export.error[:80]}"
    wall = "not logged" if export.wall_seconds is None else \
        f"{int(export.wall_seconds // 60)} min {export.wall_seconds % 60:02.0f} s"
    peak = "" if export.peak_bytes is None else f", {export.peak_bytes / 1e9:.2f} GB"
    return wall + peak


def export_table(made: dict) -> str:
    """One row per model and precision: each tool's file bytes, export wall time and peak
    resident set (llama.cpp: the conversion to f32, the quantization to q4_0 from it)."""
    tools = shown({t for exports in made.values() for t in exports})
    llm = "xnnfold-llm" in tools
    lines = ["| model | precision | xnnfold .pte bytes | " +
             "xnnfold --llm-kernels .pte bytes | " * llm +
             "optimum .pte bytes | GGUF bytes | xnnfold export: wall, peak RSS | " +
             "xnnfold --llm-kernels export | " * llm +
             "optimum export | llama.cpp convert / quantize |",
             "|---|---|" + "---|---|" * len(tools)]
    for (model, precision), exports in made.items():
        files = " | ".join(_size(exports[t].bytes if t in exports else None) for t in tools)
        costs = " | ".join(_cost(exports.get(t)) for t in tools)
        lines.append(f"| {model} | {precision} | {files} | {costs} |")
    return "\n".join(lines)
