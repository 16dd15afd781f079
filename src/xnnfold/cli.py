"""Command line: ``xnnfold report``, ``xnnfold lower``, ``xnnfold explain``.

Bad input gets one line on stderr naming the problem and exit code 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class UsageError(Exception):
    """A problem with what the user gave us: one line, exit code 2."""


def _load_program(path: str):
    import torch
    from torch.export import ExportedProgram

    file = Path(path)
    if not file.exists():
        raise UsageError(f"{path}: no such file")
    if file.is_dir():
        raise UsageError(f"{path}: is a directory, expected a .pt2 file")
    if file.suffix != ".pt2":
        raise UsageError(f"{path}: not a .pt2 file (save one with torch.export.save)")
    try:
        program = torch.export.load(str(file))
    except Exception as error:  # noqa: BLE001 - any load failure is the file's problem
        raise UsageError(f"{path}: cannot load the exported program "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:160]})")
    if not isinstance(program, ExportedProgram):
        raise UsageError(f"{path}: holds a {type(program).__name__}, not an ExportedProgram")
    return program


def _cmd_explain(args) -> int:
    import xnnfold

    program = _load_program(args.program)
    result = xnnfold.fold_gemm_params(program)
    print(xnnfold.format_explanation(result.operands, result.fallback, result.projections))
    return 0


def _cmd_lower(args) -> int:
    import xnnfold
    from .measure import STOCK, XNNFOLD, lower

    program = _load_program(args.program)
    output = Path(args.output)
    if output.parent and not output.parent.exists():
        raise UsageError(f"{args.output}: folder {output.parent} does not exist")
    try:
        lowered = lower(program, STOCK if args.stock else XNNFOLD)
    except Exception as error:  # noqa: BLE001 - a program stock cannot lower either
        raise UsageError(f"{args.program}: lowering failed ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200]})")
    output.write_bytes(lowered.pte)
    fold = lowered.fold
    if fold is not None:
        print(f"folded {len(fold.constants)} constant(s) for "
              f"{len(fold.folded)} GEMM operand(s); packed projections split: {len(fold.split_projections)}; "
              f"freed params: {', '.join(fold.freed_params) or 'none'}")
        if fold.fallback:
            print(f"fell back to stock: {fold.fallback}")
        if args.explain:
            print(xnnfold.format_explanation(fold.operands, fold.fallback, fold.projections))
    print(f"GEMMs outside delegates: {len(lowered.gemms_outside)}; delegate calls: "
          f"{lowered.delegate_calls}; .pte bytes: {lowered.pte_bytes:,}; written to {output}")
    return 0


def _cmd_report(args) -> int:
    from . import report

    names = [n for n in args.models.split(",") if n] if args.models else None
    try:
        result = report.run_report(args.size, names, args.reps, Path(args.out))
    except KeyError as error:
        raise UsageError(error.args[0])
    print(report.table(result))
    print()
    print(report.ideal_table(result))
    print(f"\nwritten: {args.out}/report.md, report.json, latency.png")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnnfold", description="Fold computed GEMM weights so XNNPACK delegates them.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    rep = commands.add_parser("report", help="stock vs xnnfold vs ideal on built-in models")
    rep.add_argument("--size", choices=["small", "large", "all"], default="small")
    rep.add_argument("--models", help="comma-separated built-in model names")
    rep.add_argument("--reps", type=int, default=20, help="timed runs per variant")
    rep.add_argument("--out", default="out/report", help="folder for report.md/.json/.png")
    rep.set_defaults(func=_cmd_report)

    low = commands.add_parser("lower", help="lower a torch.export .pt2 to a .pte")
    low.add_argument("program", help="a program saved with torch.export.save")
    low.add_argument("-o", "--output", required=True, help="the .pte to write")
    low.add_argument("--stock", action="store_true", help="lower with the stock partitioner")
    low.add_argument("--explain", action="store_true", help="print the per-GEMM table")
    low.set_defaults(func=_cmd_lower)

    exp = commands.add_parser("explain", help="per-GEMM: plain, folded or declined and why")
    exp.add_argument("program", help="a program saved with torch.export.save")
    exp.set_defaults(func=_cmd_explain)
    return parser


def _quiet() -> None:
    """torch/executorch/torchao warn a lot on every lowering; none of it is the user's concern."""
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    for name in ("torch", "torchao", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv=None) -> int:
    _quiet()
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "reps", 1) is not None and getattr(args, "reps", 1) < 1:
        parser.error("--reps must be at least 1")
    try:
        return args.func(args)
    except UsageError as error:
        if args.debug:
            raise
        print(f"xnnfold: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
