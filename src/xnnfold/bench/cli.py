"""Command line: ``xnnfold report``, ``xnnfold lower``, ``xnnfold explain``.

Bad input gets one line on stderr naming the problem and exit code 2; ``--debug`` shows the
traceback instead. Dependency noise (torchao, torch's ``_pytree``, the runtime's C++ log lines)
is filtered out unless ``--verbose`` (:mod:`xnnfold.bench.quiet`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
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


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _from_factory(spec: str):
    """``package.module:function`` returning ``(module, example_inputs)``: export it."""
    import torch

    module_name, function_name = spec.split(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))   # as ``python -m`` does: the user's own modules
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module: say what failed
        raise UsageError(f"{spec}: cannot import {module_name} "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:160]})")
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise UsageError(f"{spec}: {module_name} has no function {function_name}")
    try:
        made = factory()
    except Exception as error:  # noqa: BLE001
        raise UsageError(f"{spec}: the factory raised {type(error).__name__}: "
                         f"{str(error).splitlines()[0][:160]}")
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)
            and isinstance(made[1], tuple)):
        raise UsageError(f"{spec}: the factory must return (torch.nn.Module, tuple of example "
                         f"inputs), got {type(made).__name__}")
    printed = io.StringIO()   # a failing export prints the graph it traced; keep that out
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return torch.export.export(made[0].eval(), made[1])
    except Exception as error:  # noqa: BLE001
        raise UsageError(f"{spec}: torch.export failed ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:160]})")


def _load(source: str):
    """A .pt2 file, or a ``package.module:function`` factory (told apart by the colon form
    and there being no such file)."""
    if _FACTORY.match(source) and not Path(source).exists():
        return _from_factory(source)
    return _load_program(source)


def _cmd_explain(args) -> int:
    import xnnfold
    from ..explain import Explanation

    program = _load(args.program)
    if not args.all:
        result = xnnfold.fold_gemm_params(program)
        print(xnnfold.format_explanation(Explanation.of(result)))
        return 0
    from tabulate import tabulate

    from .devtools import why_not_delegated

    # One lowering answers both: the GEMM table from its fold, the rest from XNNPACK's log.
    partitioner = xnnfold.XnnpackPartitioner()
    rows = why_not_delegated(program, partitioner)
    result = partitioner.last_result
    print(xnnfold.format_explanation(Explanation.of(result)))
    print(f"\nops left outside delegates after xnnfold: {len(rows)} (reason as XNNPACK's "
          "partitioner logged it)")
    if rows:
        print(tabulate([[r.node, r.op, r.reason] for r in rows],
                       headers=["node", "op", "XNNPACK's reason"]))
    return 0


def _cmd_lower(args) -> int:
    import xnnfold
    from ..explain import Explanation
    from .measure import STOCK, XNNFOLD, lower

    program = _load(args.program)
    output = Path(args.output)
    if output.parent and not output.parent.exists():
        raise UsageError(f"{args.output}: folder {output.parent} does not exist")
    try:
        lowered = lower(program, STOCK if args.stock else XNNFOLD,
                        None if args.stock else {"prefer": args.prefer})
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
            print(xnnfold.format_explanation(Explanation.of(fold)))
    print(f"GEMMs outside delegates: {len(lowered.gemms_outside)}; delegate calls: "
          f"{lowered.delegate_calls}; .pte bytes: {lowered.pte_bytes:,}; written to {output}")
    return 0


def _cmd_report(args) -> int:
    from . import report

    names = [n for n in args.models.split(",") if n] if args.models else None
    variants = [v for v in args.variants.split(",") if v]
    if args.prefer == "size" and "xnnfold-size" not in variants:   # next to the default
        variants.insert(variants.index("xnnfold") + 1 if "xnnfold" in variants else 0,
                        "xnnfold-size")
    unknown = [v for v in variants if v not in report.VARIANTS]
    if unknown or not variants:
        raise UsageError(f"unknown variant {(unknown or [''])[0]!r}; known: "
                         f"{', '.join(report.VARIANTS)}")
    try:
        result = report.run_report(
            args.size, names, args.reps, Path(args.out), variants=variants, seed=args.seed,
            profile=not args.no_profile, verbose=args.verbose,
            on_skip=lambda name, why: print(f"skipped {name}: {why}", flush=True))
    except KeyError as error:
        raise UsageError(error.args[0])
    print(report.rounds_line(result))
    print(report.table(result))
    beside_ideal = report.ideal_table(result)
    if beside_ideal:
        print(f"\n{beside_ideal}")
    print(f"\n{report.lowering_table(result)}")
    written = [f for f in ("report.md", "report.json", "latency.png", "operators.png")
               if (Path(args.out) / f).exists()]
    print(f"\nwritten: {args.out}/{', '.join(written)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnnfold", description="Fold computed GEMM weights so XNNPACK delegates them.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--verbose", action="store_true",
                        help="show what dependencies print (warnings, the runtime's C++ logs)")
    commands = parser.add_subparsers(dest="command", required=True)

    rep = commands.add_parser("report", help="stock vs xnnfold vs ideal on built-in models")
    rep.add_argument("--size", choices=["small", "large", "all"], default="small")
    rep.add_argument("--models", help="comma-separated built-in model names")
    rep.add_argument("--reps", type=int, default=20, help="timed runs per variant")
    rep.add_argument("--out", default="out/report", help="folder for report.md/.json/.png")
    rep.add_argument("--variants", default=",".join(
        ["stock", "xnnfold", "stock-flag", "ideal", "constant_prop_pass"]),
        help="comma-separated: stock, xnnfold, xnnfold-size, stock-flag, ideal, "
        "constant_prop_pass")
    rep.add_argument("--seed", type=int, default=0, help="seed of the per-round order")
    rep.add_argument("--prefer", choices=["speed", "size"], default="speed",
                     help="size: also lower xnnfold with prefer='size' (variant xnnfold-size: "
                     "a tied head's table stored once, repacked on every call)")
    rep.add_argument("--no-profile", action="store_true",
                     help="skip the ETDump per-operator time breakdown")
    rep.set_defaults(func=_cmd_report)

    low = commands.add_parser("lower", help="lower a .pt2 or a model factory to a .pte")
    low.add_argument("program", help="a program saved with torch.export.save, or "
                     "package.module:function returning (module, example_inputs)")
    low.add_argument("-o", "--output", required=True, help="the .pte to write")
    low.add_argument("--stock", action="store_true", help="lower with the stock partitioner")
    low.add_argument("--explain", action="store_true", help="print the per-GEMM table")
    low.add_argument("--prefer", choices=["speed", "size"], default="speed",
                     help="where speed and size trade (a tied head): speed keeps stock's choice, "
                     "size stores the table once and repacks it on every call")
    low.set_defaults(func=_cmd_lower)

    exp = commands.add_parser("explain", help="per-GEMM: plain, folded or declined and why")
    exp.add_argument("program", help="a .pt2, or package.module:function returning "
                     "(module, example_inputs)")
    exp.add_argument("--all", action="store_true",
                     help="also list every op left outside delegates, with XNNPACK's reason")
    exp.set_defaults(func=_cmd_explain)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "reps", 1) is not None and getattr(args, "reps", 1) < 1:
        parser.error("--reps must be at least 1")
    # torch, torchao and executorch warn on every import and lowering, and the runtime's C++
    # logs to fd 2; none of it is the user's concern unless they ask (--verbose).
    stderr_filter = None
    if not args.verbose:
        from .quiet import quiet
        stderr_filter = quiet()
    try:
        return args.func(args)
    except UsageError as error:
        if args.debug:
            raise
        print(f"xnnfold: error: {error}", file=sys.stderr)
        return 2
    finally:
        if stderr_filter is not None:
            stderr_filter.close()


if __name__ == "__main__":
    sys.exit(main())
