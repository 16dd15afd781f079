"""The exports ``xnnfold bench llm-runner --folder`` compares (:mod:`xnnfold.bench.runner_real`),
each run as its user runs it, in a process of its own under ``/usr/bin/time -v`` (wall time and
peak resident set), one at a time, kept in ``--keep`` so that a rerun only measures:

- xnnfold: ``xnnfold hf FOLDER -o xnnfold-PREC.pte [--quantize 8da4w]`` (its check included),
  and with ``--xnnfold-kernels ...,llm`` also ``xnnfold-llm-PREC.pte``, made with
  ``--llm-kernels`` (the tool ``xnnfold-llm``);
- optimum-executorch: ``optimum-cli export executorch ... --recipe xnnpack --use_custom_sdpa
  --use_custom_kv_cache [--qlinear 8da4w]`` into ``optimum-PREC/model.pte``;
- llama.cpp: ``convert_hf_to_gguf.py --outtype f32`` into ``f32.gguf``, then ``llama-quantize
  f32.gguf q4_0.gguf q4_0`` (its 8da4w counterpart).

Each export's ``/usr/bin/time -v`` report is kept beside its file as ``NAME.export.log``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import timed_command

# llama.cpp's converter names a BPE tokenizer's pre-tokenizer by the hash of its output on a
# test text and refuses one it does not know; the bench folders' tokenizer (each character a
# token) is nobody's, and llama-bench feeds random token ids: the converter's default
# pre-tokenizer is declared, in the converter's own process only.
CONVERT = """import sys
sys.path.insert(0, sys.argv.pop(1))
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""

GGUF = {"fp32": "f32", "8da4w": "q4_0"}
# --xnnfold-kernels: the tool of each xnnfold .pte kept (its files are named after the tool)
XNNFOLD_TOOLS = {"default": "xnnfold", "llm": "xnnfold-llm"}


@dataclass
class Export:
    """One tool's file for one precision, with what its export cost (None: not known, the file
    was there before any log)."""

    tool: str
    precision: str
    path: Optional[Path]
    wall_seconds: Optional[float] = None
    peak_bytes: Optional[int] = None
    error: str = ""

    @property
    def bytes(self) -> Optional[int]:
        return self.path.stat().st_size if self.path and self.path.is_file() else None


def time_report(log: Path) -> tuple:
    """(wall seconds, peak resident bytes) from ``log``'s ``/usr/bin/time -v`` report."""
    seconds, kib = timed_command.time_report(log)
    return seconds, (kib * 1024 if kib is not None else None)


def _timed(command: list, log: Path, output: Path, tool: str, precision: str) -> Export:
    """``output``, made by ``command`` unless it is there already (with ``--keep``)."""
    if not output.is_file():
        print(f"{tool} {precision}: exporting ({' '.join(map(str, command))})", flush=True)
        code = timed_command.run_timed(command, log)
        if code != 0 or not output.is_file():
            lines = log.read_text(errors="replace").splitlines()
            failure = next((line for line in reversed(lines) if "Error" in line), "no output")
            print(f"{tool} {precision}: export failed (exit {code}, {log}): "
                  f"{failure.strip()[:300]}", flush=True)
            return Export(tool, precision, None, *time_report(log), error=failure.strip())
    wall, peak = time_report(log)
    print(f"{tool} {precision}: {output} ({output.stat().st_size:,} B; export "
          f"{'%.0f s' % wall if wall is not None else 'not logged'})", flush=True)
    return Export(tool, precision, output, wall, peak)


def xnnfold_export(folder: Path, keep: Path, precision: str, tool: str = "xnnfold") -> Export:
    """``tool``: ``xnnfold`` (the stock runtime's kernels) or ``xnnfold-llm``
    (``--llm-kernels``: executorch's ``llama::`` kernels, as optimum's .pte needs them)."""
    pte = keep / f"{tool}-{precision}.pte"
    command = [sys.executable, "-m", "xnnfold", "hf", folder, "-o", pte]
    if tool == "xnnfold-llm":
        command.append("--llm-kernels")
    if precision != "fp32":
        command += ["--quantize", precision]
    return _timed(command, keep / f"{tool}-{precision}.export.log", pte, tool, precision)


def optimum_export(folder: Path, keep: Path, precision: str, cli: Optional[str],
                   cache: int) -> Optional[Export]:
    pte = keep / f"optimum-{precision}" / "model.pte"
    if not cli and not pte.is_file():
        return None
    command = [cli, "export", "executorch", "--model", folder, "--task", "text-generation",
               "--recipe", "xnnpack", "--use_custom_sdpa", "--use_custom_kv_cache",
               "--max_seq_len", cache, "--output_dir", pte.parent]
    if precision != "fp32":
        command += ["--qlinear", precision]
    return _timed(command, keep / f"optimum-{precision}.export.log", pte, "optimum", precision)


def gguf_export(folder: Path, keep: Path, precision: str, args) -> Optional[Export]:
    """llama.cpp's file for ``precision`` (f32 converted, q4_0 quantized from it)."""
    kind = GGUF[precision]
    path = keep / f"{kind}.gguf"
    if not args.llama_cpp:
        return None
    if kind == "f32":
        if not path.is_file() and not args.gguf_converter:
            print("llama.cpp f32: no f32.gguf and no --gguf-converter", flush=True)
            return None
        script = keep / "convert_gguf.py"
        script.write_text(CONVERT)
        command = [args.gguf_python or sys.executable, script, args.gguf_converter, folder,
                   "--outtype", "f32", "--outfile", path]
        return _timed(command, keep / "f32.export.log", path, "llama.cpp", precision)
    source = gguf_export(folder, keep, "fp32", args)
    if source is None or source.path is None:
        return None
    command = [Path(args.llama_cpp) / "llama-quantize", source.path, path, kind]
    return _timed(command, keep / f"{kind}.export.log", path, "llama.cpp", precision)


def exports(folder: Path, keep: Path, precision: str, args) -> dict:
    """{tool: Export} for one folder and precision, made one after the other: xnnfold's for
    each of ``args.kernel_list`` (``default``, ``llm``), then optimum's and llama.cpp's."""
    keep.mkdir(parents=True, exist_ok=True)
    made = {tool: xnnfold_export(folder, keep, precision, tool)
            for kernels, tool in XNNFOLD_TOOLS.items() if kernels in args.kernel_list}
    made |= {"optimum": optimum_export(folder, keep, precision, args.optimum_cli, args.cache),
             "llama.cpp": gguf_export(folder, keep, precision, args)}
    return {tool: export for tool, export in made.items() if export is not None}
