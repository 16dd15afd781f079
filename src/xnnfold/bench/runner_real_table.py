"""The tables of ``xnnfold bench llm-runner --folder`` (:mod:`xnnfold.bench.runner_real`): speed
per model, precision and thread count, and what each export cost."""

from __future__ import annotations

TOOLS = ("xnnfold", "optimum", "llama.cpp")
KINDS = {"fp32": "fp32 (llama.cpp f32)", "8da4w": "8da4w (llama.cpp q4_0)"}


def _ms(row: dict, tool: str, key: str, digits: int) -> str:
    return f"{row[tool][key]:.{digits}f}" if tool in row else "—"


def _ratio(row: dict, tool: str, other: str, key: str) -> str:
    if tool not in row or other not in row or not row[other][key]:
        return "—"
    return f"{row[tool][key] / row[other][key]:.2f}"


def speed_table(rows: list, args) -> str:
    lines = [
        f"Prefill of {args.prompt} tokens and decode per token ({args.new} generated) in ms, "
        "medians; xnnfold / optimum / llama.cpp; ratios xnnfold over the other; the floor: "
        "bytes a decode step reads over the copy bandwidth at that thread count.", "",
        "| model | precision | threads | prefill | decode | xnnfold / optimum, prefill / "
        "decode | xnnfold / llama.cpp, prefill / decode | floor (copy GB/s) | decode / floor "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        prefill = " / ".join(_ms(row, t, "prefill_ms", 0) for t in TOOLS)
        decode = " / ".join(_ms(row, t, "decode_ms", 2) for t in TOOLS)
        versus = {o: f"{_ratio(row, 'xnnfold', o, 'prefill_ms')} / "
                     f"{_ratio(row, 'xnnfold', o, 'decode_ms')}" for o in TOOLS[1:]}
        floor = " / ".join(f"{row[t]['decode_ms'] / row['floor_ms']:.2f}" if t in row else "—"
                           for t in TOOLS)
        load = f"{row['load'][0]} -> {row['load'][-1]}"
        lines.append(f"| {row['model']} | {KINDS.get(row['precision'], row['precision'])} | "
                     f"{row['threads']} | {prefill} | {decode} | {versus['optimum']} | "
                     f"{versus['llama.cpp']} | {row['floor_ms']:.2f} ms "
                     f"({row['copy_GBps']:.1f}) | {floor} | {load} |")
    prompts = {t: sorted({n for r in rows if t in r for n in r[t]["prompt_tokens"]})
               for t in TOOLS}
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
    lines = ["| model | precision | xnnfold .pte bytes | optimum .pte bytes | GGUF bytes | "
             "xnnfold export: wall, peak RSS | optimum export | llama.cpp convert / quantize |",
             "|---|---|---|---|---|---|---|---|"]
    for (model, precision), exports in made.items():
        files = " | ".join(_size(exports[t].bytes if t in exports else None) for t in TOOLS)
        costs = " | ".join(_cost(exports.get(t)) for t in TOOLS)
        lines.append(f"| {model} | {precision} | {files} | {costs} |")
    return "\n".join(lines)
