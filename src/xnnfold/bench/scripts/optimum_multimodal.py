"""Against optimum-executorch on the same folders in the same runner: Gemma3 image-text,
Voxtral and T5 at real per-layer dims (random weights; the encoders and text models cut to a
few layers, the text vocabulary to 32,768), each exported by `optimum-cli export executorch
--recipe xnnpack` (Gemma3 / Voxtral with `--use_custom_sdpa --use_custom_kv_cache`) and by
`xnnfold hf`: export wall time and peak RSS, .pte bytes, the encoder, the prefill with the image
or audio, decode per token, the share outside XNNPACK, greedy text or ids against `generate`.

    xnnfold bench optimum-multimodal --optimum-cli /tmp/optvenv/bin/optimum-cli
                                     [--models gemma3,voxtral,t5] [--dir DIR]
                                     [--encoder-layers 2] [--text-layers 2] [--rounds 5]
                                     [--new 16] [--output FILE.md]

optimum-executorch 1.1.0 pins transformers 5.0.0rc1: give the optimum-cli of a venv of its own
(torch 2.13.0 CPU, executorch 1.5.1). Gemma3 / Voxtral run in executorch's MultimodalRunner,
T5 through the speech runner's calls (xnnfold.export.seq2seq.Seq2SeqProgram). One thread,
interleaved rounds, medians. Folders and .pte files are kept in --dir and reused when there.
"""

from __future__ import annotations

import math
from pathlib import Path

from xnnfold.bench.scripts import parser

MODELS = ("gemma3", "voxtral", "t5")


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--optimum-cli", help="optimum-cli of a venv with optimum-executorch "
                      "(without it, only xnnfold's exports are measured)")
    args.add_argument("--models", default=",".join(MODELS), help="comma-separated, of "
                      + ", ".join(MODELS))
    args.add_argument("--dir", default="out/optimum-multimodal", help="folders, .pte files "
                      "and export logs (reused when there)")
    args.add_argument("--encoder-layers", type=int, default=2, help="vision / audio encoder "
                      "layers (Gemma3's SigLIP has 27, Voxtral's encoder 32)")
    args.add_argument("--text-layers", type=int, default=2, help="text model layers (Gemma3-4B "
                      "has 34, Voxtral-Mini 30)")
    args.add_argument("--max-seq-len", type=int, default=2048, help="the KV cache's rows "
                      "(xnnfold's --max-cache; optimum's --max_seq_len, which its multimodal "
                      "task ignores: 2048 rows)")
    args.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds")
    args.add_argument("--new", type=int, default=16, help="greedy tokens generated")
    args.add_argument("--output", help="write the table (markdown) here too")
    return args


def _cell(value) -> str:
    if isinstance(value, bool):
        return "equal" if value else "**differs**"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


COLUMNS = ("export", ".pte bytes", "encoder ms", "prefill ms", "decode ms/token",
           "decode step ms", "outside XNNPACK", "greedy vs generate")


def table_rows(name: str, exports: dict, measured: dict) -> list:
    rows = []
    for tool, export in exports.items():
        cells = measured.get(tool, {})
        if export.status.startswith("ok"):
            made = f"{export.seconds:,.0f} s, {export.peak_gb:.2f} GB"
        else:
            made = f"fails ({export.seconds:,.0f} s, {export.peak_gb:.2f} GB): {export.status}"
        equal = cells.get("text equals generate", cells.get("ids equal generate", ""))
        rows.append([name, tool, made] + [_cell(cells.get(c, "")) for c in (
            ".pte bytes", "encoder ms", "prefill ms", "decode ms/token", "decode step ms")]
            + [cells.get("encoder outside XNNPACK", cells.get("step outside XNNPACK", "")),
               _cell(equal)])
    return rows


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)       # --help answers before torch is imported
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        build_parser().error(f"--models: of {', '.join(MODELS)}")
    if min(args.encoder_layers, args.text_layers, args.rounds, args.new) < 1:
        build_parser().error("--encoder-layers, --text-layers, --rounds, --new: at least 1")
    if args.optimum_cli and not (Path(args.optimum_cli).is_file()
                                 and Path(args.optimum_cli).with_name("python").is_file()):
        build_parser().error(f"--optimum-cli {args.optimum_cli}: not an optimum-cli with a "
                             "python beside it (a venv's bin/)")
    from xnnfold.bench.decode import machine_line, one_thread
    from xnnfold.bench.multimodal_optimum import (export_optimum, export_xnnfold,
                                                  write_folder)
    from xnnfold.bench.multimodal_optimum_measure import measure_multimodal, measure_t5

    root = Path(args.dir)
    lines = ["| model | tool | " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for name in models:
        folder = write_folder(name, root / "folders", args.encoder_layers, args.text_layers)
        print(f"{name}: {folder.dims}; {folder.parameters:,} parameters", flush=True)
        exports = {}
        if args.optimum_cli:
            exports["optimum"] = export_optimum(folder, args.optimum_cli,
                                                root / name / "optimum", args.max_seq_len)
            print(f"  {exports['optimum']}", flush=True)
        exports["xnnfold"] = export_xnnfold(folder, root / name / "xnnfold", args.max_seq_len)
        print(f"  {exports['xnnfold']}", flush=True)
        ptes = {tool: e.pte for tool, e in exports.items() if e.status.startswith("ok")}
        one_thread()
        print(f"  measuring: {machine_line()}", flush=True)
        measured = {}
        if ptes:
            measure = measure_t5 if name == "t5" else measure_multimodal
            measured = (measure(folder.path, ptes, args.rounds, args.new) if name == "t5"
                        else measure(name, folder.path, ptes, args.rounds, args.new))
        for tool, cells in measured.items():
            print(f"  {tool}: {cells}", flush=True)
        print(f"  after: {machine_line()}", flush=True)
        lines += ["| " + " | ".join(row) + " |" for row in table_rows(name, exports, measured)]
    table = "\n".join(lines)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
